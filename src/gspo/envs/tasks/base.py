"""A task is a dataset of prompts with verifiable answers plus the reward function that checks them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """One problem."""

    prompt: str
    """Text the policy is conditioned on (for tiny char-level models, e.g. "37+45=")."""
    answer: str
    """Reference answer the reward compares against (e.g. "82")."""
    demo: str | None = None
    """A correct completion, for the supervised cold start (None where a task has none)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else a reward needs (numbers of a countdown problem, difficulty, source row)."""
    images: tuple[Any, ...] = ()
    """The prompt's images (a file path, raw bytes or a ``PIL.Image.Image`` each), in the order of
    the prompt's ``<image>`` placeholders; ``()`` for a text prompt."""


RewardFn = Callable[[str, Example], float]
"""A reward maps (completion text, example) to a float. It may raise; the trainer then scores 0."""


@dataclass
class Task:
    """A named problem family: deterministic splits and a reward."""

    name: str
    train: list[Example]
    test: list[Example]
    reward: RewardFn
    description: str = ""
    skipped_rows: list[str] = field(default_factory=list)
    """Messages for data-file rows dropped as malformed (``bad_rows="skip"``), one per row."""
    skipped_kinds: dict[str, int] = field(default_factory=dict)
    """How many of ``skipped_rows`` are of each kind (``gspo.envs.tasks.reading.KINDS``)."""
    data_checks: dict[str, int] = field(default_factory=dict)
    """``data/*`` counts of the duplicate checks (:mod:`gspo.envs.tasks.checks`)."""


def call_builder(builder: Callable[..., Task], **kwargs: Any) -> Task:
    """Call a task builder with the keywords its signature accepts (all of them when it takes
    ``**kwargs``): builders written before the file arguments (``train_file``, ``test_file``,
    ``prompt_key``, ``answer_key``, ``answer_format``) existed take only ``n_train, n_test,
    seed, difficulty`` and keep working."""
    try:
        params = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): pass everything
        return builder(**kwargs)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return builder(**kwargs)
    accepted = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return builder(**{k: v for k, v in kwargs.items() if k in accepted})
