"""Reading one image (Pillow only, no torch): data files' images are checked with it before
torch and the model load (``gspo.envs.tasks.files``); the vision models decode with it too."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

IMAGE_PLACEHOLDER = "<image>"
"""Where an image goes in a prompt's text (one per image, in order)."""


def load_image(image: Any, *, where: str = "image"):
    """A ``PIL.Image`` in RGB from a path, raw bytes or an image; ``ValueError`` naming
    ``where`` for a missing, unreadable or corrupt one."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    try:
        if isinstance(image, (bytes, bytearray, memoryview)):
            img = Image.open(io.BytesIO(bytes(image)))
        elif isinstance(image, (str, Path)):
            if not Path(image).is_file():
                raise ValueError(f"{where}: no image file {str(image)!r}")
            img = Image.open(image)
        else:
            raise ValueError(f"{where}: expected an image path, bytes or image, got {image!r:.60}")
        img.load()  # decode now: a truncated file fails here, not mid-run
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ValueError(f"{where}: not a readable image ({exc})") from None
    return img.convert("RGB")
