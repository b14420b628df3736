"""A visual task: count the shapes of one colour in a small rendered image.

The image (:data:`IMAGE_SIZE` pixels square, white) is a :data:`GRID` x :data:`GRID` grid of
:data:`CELL`-pixel cells; ``difficulty`` cells hold one shape each (a square, a circle or a
triangle, red, green or blue). The prompt ``"<image>count red="`` asks how many shapes are red;
the answer is the count (``"2"``). The ``<image>`` placeholder marks where the model's chat
template or processor puts the image's vision tokens (:attr:`Example.images` holds the image).

Cells are :data:`CELL` = 14 pixels so that one cell is one vision patch of a Qwen2-VL style
encoder (patch 14, or 7): each shape's colour sits in its own patch, and the count is a sum
over patches, which a tiny random-init model can learn.

A completion may answer directly (``"2"``, the *short* form) or with a scratchpad (the *long*
form): the running count after each shape in reading order (row by row, left to right), e.g.
``"1,1,2,2"`` for shapes red, blue, red, green asked about red. As in the ``scratchpad`` task
(:mod:`gspo.envs.tasks.scratchpad`), the reward checks only the text after the last ``,``, the
cold-start demos mix both forms (:data:`LONG_FRACTION` long), and the long form holds one count
per shape (2 x difficulty - 1 characters below 10 shapes of the colour asked), so response length
is free to move under RL.

Rendering is deterministic: integer geometry, no anti-aliasing, no fonts, and every drawing
parameter is in ``meta["shapes"]`` (so tests re-count the answer from them and from the pixels).
Pillow is needed (``pip install 'gspo[vision]'``); it is imported only when an image is drawn.
"""

from __future__ import annotations

import random
from typing import Any

from gspo.envs.tasks.base import Example

__all__ = [
    "CELL",
    "COLOURS",
    "DEFAULT_SHAPES",
    "GRID",
    "IMAGE_SIZE",
    "KINDS",
    "LONG_FRACTION",
    "MAX_SHAPES",
    "MIN_SHAPES",
    "render",
    "running_counts",
    "sample_shapes",
    "shapes_key",
    "shapes_space",
]

CELL = 14
"""Pixels per grid cell: one vision patch of a patch-14 encoder (two of a patch-7 one)."""
GRID = 4
"""Cells per side."""
IMAGE_SIZE = CELL * GRID
"""56: a multiple of 28, so a patch-14 encoder with 2x2 merging gives whole tokens (4 of them)."""
MARGIN = 2
"""Pixels of background around each shape inside its cell, so neighbouring shapes stay apart."""
BACKGROUND = (255, 255, 255)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (50, 80, 220),
}
KINDS = ("square", "circle", "triangle")
MIN_SHAPES = 1
DEFAULT_SHAPES = 4
MAX_SHAPES = 12
"""Of the 16 cells: a few stay empty, so where the shapes are still varies."""
LONG_FRACTION = 0.5
"""Share of cold-start demonstrations written in the long (scratchpad) form."""
PILLOW_INSTALL = "pip install 'gspo[vision]' (Pillow)"

DESCRIPTION = (
    "Count the shapes of one colour in a 56x56 image: '<image>count red=' -> '2', directly or "
    "with the running count over the shapes in reading order '1,1,2,2' (only the text after the "
    "last ',' is scored; cold-start demos mix both forms). Difficulty = number of shapes. "
    "Needs a vision-language model and Pillow."
)

Shape = tuple[int, str, str]
"""(cell index in reading order, colour name, kind)."""


def running_counts(shapes: list[Shape], colour: str) -> list[int]:
    """The number of ``colour`` shapes seen after each shape, in reading order."""
    out, seen = [], 0
    for _cell, shape_colour, _kind in sorted(shapes):
        seen += shape_colour == colour
        out.append(seen)
    return out


def render(shapes: list[Shape]) -> Any:
    """The RGB ``PIL.Image.Image`` of these shapes (pure function of its argument)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise ImportError(
            f"the shapes task draws its images with Pillow: {PILLOW_INSTALL}"
        ) from None
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
    draw = ImageDraw.Draw(image)
    low, high = MARGIN, CELL - 1 - MARGIN  # inclusive pixel bounds of a shape inside its cell
    for cell, colour, kind in shapes:
        x, y = (cell % GRID) * CELL, (cell // GRID) * CELL
        fill = COLOURS[colour]
        box = (x + low, y + low, x + high, y + high)
        if kind == "square":
            draw.rectangle(box, fill=fill)
        elif kind == "circle":
            draw.ellipse(box, fill=fill)
        elif kind == "triangle":
            apex = (x + CELL // 2, y + low)
            draw.polygon([apex, (x + low, y + high), (x + high, y + high)], fill=fill)
        else:
            raise ValueError(f"unknown shape kind {kind!r}; valid: {', '.join(KINDS)}")
    return image


def sample_shapes(rng: random.Random, count: int, long_fraction: float = LONG_FRACTION) -> Example:
    """Draw one problem of ``count`` shapes; its demo is long with probability ``long_fraction``."""
    cells = sorted(rng.sample(range(GRID * GRID), count))
    colours = list(COLOURS)
    target = rng.choice(colours)
    # The answer is uniform over 0..count, so no answer is a good blind guess: a model must look
    # at the image (colours drawn independently would make "1" right 40% of the time at 4 shapes).
    hits = set(rng.sample(range(count), rng.randint(0, count)))
    others = [c for c in colours if c != target]
    shapes = [
        (cell, target if i in hits else rng.choice(others), rng.choice(KINDS))
        for i, cell in enumerate(cells)
    ]
    counts = running_counts(shapes, target)
    answer = str(counts[-1])
    form = "long" if rng.random() < long_fraction else "short"
    demo = ",".join(map(str, counts)) if form == "long" else answer
    problem = ";".join(f"{c}{col[0]}{k[0]}" for c, col, k in shapes) + f">{target}"
    meta = {
        "difficulty": count,
        "shapes": shapes,
        "colour": target,
        "form": form,
        # The prompt text repeats across problems (only the image differs): the data checks
        # and the split draw tell problems apart by this key.
        "problem": problem,
    }
    prompt = f"<image>count {target}="
    return Example(prompt=prompt, answer=answer, demo=demo, meta=meta, images=(render(shapes),))


def shapes_key(example: Example) -> str:
    """The split key: every drawing parameter and the colour asked about."""
    return example.meta["problem"]


def shapes_space(count: int) -> int:
    """Every problem of ``count`` shapes has probability at least 1 / (3 x (16 x 9)^count)."""
    return len(COLOURS) * (GRID * GRID * len(COLOURS) * len(KINDS)) ** count
