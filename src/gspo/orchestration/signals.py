"""One warning when a run has had little learning signal for several steps in a row.

Two ways an RL run learns nothing while looking busy:

- most responses are cut at ``max_new_tokens``: the answer never gets written, every sample
  scores the same, and the length limit is the cause (the tiny models' default is 8 tokens);
- most groups have equal rewards for all their samples: their advantages are 0 and they add
  nothing to the gradient (a task far too hard for the model, or already solved).

:class:`SignalWatch` sees each step's truncated share and zero-advantage share and prints one
warning, once per run, naming what it saw and the likely fix.

:class:`StopRequest` turns SIGINT / SIGTERM into a clean stop: the current step finishes and
a checkpoint is written; a second signal quits at once.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PATIENCE = 5
"""Consecutive steps a condition must hold before the warning (a few unlucky steps are normal)."""
TRUNCATED_SHARE = 0.5
"""A step counts when more than this share of its responses hit max_new_tokens."""
ZERO_SHARE = 0.8
"""A step counts when more than this share of its samples have zero advantage. Higher than the
truncation share: late in a run that works, half the groups agreeing (all solved) is normal."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class SignalWatch:
    """Counts the steps in a row with most responses truncated, or most advantages zero."""

    max_new_tokens: int
    echo: Callable[[str], None] = _stderr
    patience: int = PATIENCE
    truncated_share: float = TRUNCATED_SHARE
    zero_share: float = ZERO_SHARE
    warned: bool = False
    _truncated: list[float] = field(default_factory=list)
    _zero: list[float] = field(default_factory=list)

    def update(
        self, step: int, truncated_fraction: float, zero_fraction: float, reward_mean: float
    ) -> str | None:
        """Record one step; return (and print) the warning the first time one is due."""
        if self.warned:
            return None
        self._truncated = [*self._truncated, truncated_fraction][-self.patience :]
        self._zero = [*self._zero, zero_fraction][-self.patience :]
        reasons = []
        if len(self._truncated) == self.patience and min(self._truncated) > self.truncated_share:
            mean = sum(self._truncated) / self.patience
            reasons.append(
                f"{mean:.0%} of responses were cut off at max_new_tokens={self.max_new_tokens}: "
                "raise --max-new-tokens so that answers can end"
            )
        if len(self._zero) == self.patience and min(self._zero) > self.zero_share:
            mean = sum(self._zero) / self.patience
            if reward_mean >= 0.5:
                fix = "the task looks solved: use harder data (--difficulty, other problems)"
            else:
                fix = (
                    "the task looks too hard for the model: cold-start it on demonstrations "
                    "(gspo sft, then --model that folder), use easier data (--difficulty), or "
                    "raise --max-new-tokens"
                )
            reasons.append(
                f"{mean:.0%} of samples were in groups whose rewards were all equal (zero "
                f"advantage: no gradient; mean reward {reward_mean:.2f}): {fix}"
            )
        if not reasons:
            return None
        self.warned = True
        message = (
            f"gspo: warning: little learning signal in the {self.patience} steps up to step "
            f"{step}: " + "; ".join(reasons) + ". (Printed once.)"
        )
        self.echo(message)
        return message


class Interrupted(KeyboardInterrupt):
    """A second SIGINT/SIGTERM: leave at once (``finally`` blocks still close Ray, engines)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """SIGINT and SIGTERM while a loop runs: the first asks it to stop after the current step
    (which then writes a checkpoint); a second raises :class:`Interrupted` at once.

    Used as a context manager around a training loop; the previous handlers come back on exit.
    Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo: Callable[[str], None] = _stderr) -> None:
        self.echo = echo
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise Interrupted(signum)
        self.signum = signum
        name = signal.Signals(signum).name
        self.echo(
            f"gspo: {name}: stopping after the current step and writing a checkpoint "
            "(press Ctrl-C again to quit at once)"
        )

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
