"""The visual task ``shapes``: deterministic, disjoint splits, a difficulty knob, answers that
re-count from the drawing parameters and from the pixels, demos that score 1, images identical
from run to run."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys

import pytest

if os.environ.get("GSPO_REQUIRE_PILLOW") != "1":  # CI installs the extra: a skip would hide
    pytest.importorskip("PIL", reason="needs Pillow (pip install 'gspo[vision]')")

from gspo.envs.tasks import DIFFICULTIES, TASKS, Task, make_task
from gspo.envs.tasks.checks import problem_key
from gspo.envs.tasks.scratchpad import scratchpad_reward
from gspo.envs.tasks.shapes import CELL, COLOURS, GRID, IMAGE_SIZE, LONG_FRACTION, render
from gspo.envs.tasks.synthetic import split_of


@functools.cache
def build(difficulty: int | None = None, seed: int = 0, n_train: int = 300) -> Task:
    return make_task("shapes", n_train=n_train, n_test=30, seed=seed, difficulty=difficulty)


def image_digest(task: Task) -> str:
    """One hash over every image of both splits (raw RGB pixels, size and mode)."""
    h = hashlib.sha256()
    for example in [*task.train, *task.test]:
        for image in example.images:
            h.update(f"{image.mode}{image.size}".encode())
            h.update(image.tobytes())
    return h.hexdigest()


def test_registered_with_its_difficulty_range() -> None:
    assert "shapes" in TASKS
    low, default, high = DIFFICULTIES["shapes"]
    assert (low, default, high) == (1, 4, 12)
    with pytest.raises(ValueError, match=r"difficulty of task 'shapes' must be in \[1, 12\]"):
        make_task("shapes", n_train=1, n_test=1, difficulty=13)


def test_examples_carry_one_image_per_placeholder() -> None:
    for example in build().train[:50]:
        assert example.prompt.count("<image>") == len(example.images) == 1
        (image,) = example.images
        assert image.mode == "RGB" and image.size == (IMAGE_SIZE, IMAGE_SIZE)
        assert example.prompt == f"<image>count {example.meta['colour']}="


def test_splits_are_disjoint_and_distinct() -> None:
    task = build()
    train = {e.meta["problem"] for e in task.train}
    test = {e.meta["problem"] for e in task.test}
    assert len(train) == len(task.train) and len(test) == len(task.test)  # no repeats
    assert not train & test
    assert all(split_of(key) == "train" for key in train)
    assert all(split_of(key) == "test" for key in test)
    # The data checks tell problems apart although the prompt text repeats.
    assert len({problem_key(e) for e in task.train}) == len(task.train)


def test_deterministic_by_seed_and_test_split_independent_of_n_train() -> None:
    a, b = build(seed=3), make_task("shapes", n_train=300, n_test=30, seed=3)
    assert [e.meta for e in a.train] == [e.meta for e in b.train]
    assert image_digest(a) == image_digest(b)
    other = build(seed=4)
    assert [e.meta for e in a.train] != [e.meta for e in other.train]
    smaller = make_task("shapes", n_train=10, n_test=30, seed=3)
    assert [e.meta for e in smaller.test] == [e.meta for e in a.test]


def test_difficulty_is_the_number_of_shapes() -> None:
    for difficulty in (1, 4, 12):
        task = build(difficulty)
        assert all(len(e.meta["shapes"]) == difficulty for e in task.train)
        assert all(len(e.demo.split(",")) in (1, difficulty) for e in task.train)
    easy, hard = build(1), build(12)
    assert {e.meta["problem"] for e in easy.train}.isdisjoint(e.meta["problem"] for e in hard.train)
    # More shapes, larger counts: the harder task's mean answer is higher.
    mean = lambda t: sum(int(e.answer) for e in t.train) / len(t.train)  # noqa: E731
    assert mean(hard) > mean(easy) + 2


def test_no_answer_is_a_good_blind_guess() -> None:
    """The count is uniform over 0..difficulty: a model that ignores the image and always says
    the commonest count is right about 1 / (difficulty + 1) of the time (0.2 at 4 shapes)."""
    answers = [e.answer for e in build(4).train]
    shares = [answers.count(str(k)) / len(answers) for k in range(5)]
    assert max(shares) < 0.3 and min(shares) > 0.1


def pixel_count(image, colour: str) -> int:
    """Count the shapes of ``colour`` from the pixels: every shape covers its cell's centre."""
    rgb = COLOURS[colour]
    centre = CELL // 2
    return sum(
        image.getpixel((col * CELL + centre, row * CELL + centre)) == rgb
        for row in range(GRID)
        for col in range(GRID)
    )


@pytest.mark.parametrize("difficulty", [1, 4, 12])
def test_answers_recount_from_parameters_and_pixels(difficulty: int) -> None:
    task = build(difficulty)
    for example in [*task.train, *task.test]:
        colour = example.meta["colour"]
        from_params = sum(c == colour for _, c, _ in example.meta["shapes"])
        assert example.answer == str(from_params)
        assert pixel_count(example.images[0], colour) == from_params
        # Every shape's centre carries its colour, and only the drawn cells are not background.
        drawn = sum(pixel_count(example.images[0], name) for name in COLOURS)
        assert drawn == difficulty


def test_demos_score_one_and_mix_both_forms() -> None:
    task = build(6)
    forms = [e.meta["form"] for e in task.train]
    assert abs(forms.count("long") / len(forms) - LONG_FRACTION) < 0.1
    for example in [*task.train, *task.test]:
        assert scratchpad_reward(example.demo, example) == 1.0
        assert task.reward(example.demo, example) == 1.0
        assert task.reward(example.answer, example) == 1.0
        wrong = str(int(example.answer) + 1)
        assert task.reward(wrong, example) == 0.0
        if example.meta["form"] == "long":
            # The running count: one entry per shape, non-decreasing by 0 or 1, ending at the answer.
            counts = [int(x) for x in example.demo.split(",")]
            assert len(counts) == 6 and counts[-1] == int(example.answer)
            assert all(b - a in (0, 1) for a, b in zip([0, *counts], counts, strict=False))


def test_images_identical_in_a_fresh_process() -> None:
    """Rendering depends on nothing but the drawing parameters: another interpreter (another
    hash seed) draws the same pixels."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from test_shapes_task import build, image_digest\n"
        "print(image_digest(build(seed=7)))\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run(
        [sys.executable, "-c", code, here], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == image_digest(build(seed=7))


def test_render_is_a_pure_function_of_the_shapes() -> None:
    shapes = [(0, "red", "square"), (5, "green", "circle"), (15, "blue", "triangle")]
    assert render(shapes).tobytes() == render(list(shapes)).tobytes()
    assert render(shapes).tobytes() != render(shapes[:2]).tobytes()
    with pytest.raises(ValueError, match="unknown shape kind 'star'"):
        render([(0, "red", "star")])


def test_missing_pillow_is_one_line_naming_the_extra(monkeypatch) -> None:
    from gspo.config import machine
    from gspo.config.train import TrainConfig

    monkeypatch.setattr(machine, "installed", lambda module: module != "PIL")
    problems = machine.machine_problems(TrainConfig.of(task="shapes"))
    assert problems == [
        "task='shapes' needs Pillow (it draws the task's images), which is not installed: "
        "pip install 'gspo[vision]'"
    ]
    assert machine.machine_problems(TrainConfig.of(task="scratchpad")) == []
