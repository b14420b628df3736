"""A task is a dataset of prompts with verifiable answers plus the reward function that checks them."""

from __future__ import annotations

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
    data_checks: dict[str, int] = field(default_factory=dict)
    """``data/*`` counts of the duplicate checks (:mod:`gspo.envs.tasks.checks`)."""
