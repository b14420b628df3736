"""reasoning-gym's procedural datasets as gspo tasks, each scored by its dataset's own
``score_answer``: ``--task reasoning_gym:NAME`` (e.g. ``reasoning_gym:basic_arithmetic``).

* Dataset options follow the name, comma-separated ``key=value`` with Python literals
  (``reasoning_gym:basic_arithmetic,min_terms=2,max_terms=2``); ``--difficulty N`` sets the
  dataset's curriculum to level N (reasoning-gym's own levels, from 0; datasets without a
  curriculum refuse it); ``--n-train``/``--n-test`` are the dataset sizes, ``--seed`` its seed.
* reasoning-gym draws problem ``i`` from ``Random(seed + i)``, so two datasets whose seeds
  differ by one share all but one problem: the held-out split is drawn from a distant seed and
  its problems are taken out of the training split.
* The prompt is the problem's question as reasoning-gym writes it; the answer (and SFT's
  demonstration) its reference answer. A completion's answer is what it puts in the last
  ``<answer>...</answer>`` (reasoning-gym's own convention), else its first line, stripped.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.synthetic import INTEGRATION_TASKS

from .options import import_extra, parse_name

PREFIX = "reasoning_gym"
INSTALL = "pip install 'gspo[reasoning-gym]'"
TEST_SEED_OFFSET = 1_000_003
"""The held-out split's seed is the run's seed plus this (far: see the module doc)."""


def _reasoning_gym() -> Any:
    return import_extra("reasoning_gym", PREFIX, "reasoning-gym", INSTALL)


def _config(name: str, options: dict[str, Any], difficulty: int | None) -> dict[str, Any]:
    """The dataset's config fields: its curriculum's level ``difficulty`` (when given), then
    the options the task name sets."""
    rg = _reasoning_gym()
    if difficulty is None:
        return dict(options)
    if not rg.factory.has_curriculum(name):
        raise ValueError(f"--difficulty: reasoning-gym's {name!r} has no curriculum (levels)")
    curriculum = rg.factory.create_curriculum(name)
    top = max(len(a.levels) for a in curriculum.attributes.values()) - 1
    if not 0 <= difficulty <= top:
        raise ValueError(f"--difficulty for reasoning-gym's {name!r}: a curriculum level in "
                         f"[0, {top}], got {difficulty}")  # fmt: skip
    curriculum.set_global_level(difficulty)
    config = curriculum.generate_configuration({"size": 1, "seed": 0})
    # size and seed are given when each split is drawn
    fields = {k: v for k, v in vars(config).items() if k not in ("size", "seed")}
    return {**fields, **options}


@cache
def scorer(name: str) -> Any:
    """The dataset's ``score_answer(answer, entry) -> float`` (one instance per dataset)."""
    return _reasoning_gym().get_score_answer_fn(name)


def answer_of(completion: str) -> str:
    """The answer a completion gives: its last ``<answer>...</answer>``, else its first line."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(completion)
    return tagged if tagged is not None else completion.strip().split("\n")[0].strip()


def score(completion: str, example: Example) -> float:
    """reasoning-gym's verdict on the completion's answer for the problem's entry."""
    entry = example.meta["entry"]
    return float(
        scorer(entry["metadata"]["source_dataset"])(answer=answer_of(completion), entry=entry)
    )


def _examples(name: str, config: dict[str, Any], size: int, seed: int) -> list[Example]:
    if size == 0:
        return []
    try:
        data = _reasoning_gym().create_dataset(name, size=size, seed=seed, **config)
    except (TypeError, ValueError, AssertionError) as exc:  # an unknown field or a bad value
        raise ValueError(
            f"--task {PREFIX}:{name}: reasoning-gym refuses the config: {exc}"
        ) from None
    return [
        Example(
            entry["question"],
            str(entry["answer"]),
            demo=str(entry["answer"]),
            meta={"entry": entry},
        )
        for entry in data
    ]


def build(
    spec: str, *, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None
) -> Task:
    """The task ``reasoning_gym:SPEC``: ``n_test`` held-out problems and up to ``n_train`` to
    train on (fewer where the problem space is small: the held-out ones are taken out)."""
    name, options = parse_name(PREFIX, spec)
    rg = _reasoning_gym()
    if name not in rg.factory.DATASETS:
        import difflib

        close = difflib.get_close_matches(name, list(rg.factory.DATASETS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"--task {PREFIX}:{name}: reasoning-gym has no dataset {name!r}{hint} "
                         f"({len(rg.factory.DATASETS)} datasets: reasoning_gym.factory.DATASETS)")  # fmt: skip
    config = _config(name, options, difficulty)
    test = _examples(name, config, n_test, seed + TEST_SEED_OFFSET)
    held_out = {ex.prompt for ex in test}
    train = [ex for ex in _examples(name, config, n_train, seed) if ex.prompt not in held_out]
    level = "" if difficulty is None else f", curriculum level {difficulty}"
    return Task(f"{PREFIX}:{spec}", train, test, score,
                description=f"reasoning-gym {spec}{level} (seed {seed})")  # fmt: skip


INTEGRATION_TASKS[PREFIX] = build
