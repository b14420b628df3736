"""One progress bar over a run made of phases (``gspo demo``: cold-start SFT, then RL), whose ETA
is the time left in the whole run, not in the phase that happens to be running.

Inside ``with PhasedBar(...)`` and ``with bar.phase(name)``, :func:`gspo.orchestration.logging.
progress_bar` returns a view of the one bar instead of a new tqdm bar, so the SFT and RL loops
need no change. The ETA: the running phase's own average seconds per step (its evaluations
included), converted to seconds per unit of expected cost, times every unit left in this phase
and the later ones. A phase's weight is its expected cost per step relative to the others (an
SFT step of the demo costs about 1.3 RL steps); load slows every phase alike, so the ratio
holds on a busy machine where absolute times do not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

ACTIVE: ContextVar[PhasedBar | None] = ContextVar("gspo_phased_bar", default=None)
"""The phased bar that :func:`gspo.orchestration.logging.progress_bar` hands views of."""

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"


@dataclass
class Phase:
    name: str
    steps: int
    weight: float  # expected seconds per step relative to the other phases

    @property
    def units(self) -> int:
        """Bar units per step: the weight in hundredths (whole numbers add up exactly)."""
        return max(round(self.weight * 100), 1)


def phased_eta(phases: list[Phase], current: int, done: list[int], per_unit_s: float) -> float:
    """Seconds left in the whole run: the units left in phase ``current`` and the later ones
    (``done``: steps done per phase) at ``per_unit_s``, the current phase's average seconds per
    unit in this process (its steps' time over steps x weight)."""
    later = zip(phases[current:], done[current:], strict=True)
    return per_unit_s * sum(p.units * max(p.steps - d, 0) for p, d in later)


class _Bar(tqdm):
    """tqdm with its remaining time replaced by :func:`phased_eta` (through the rate it shows)."""

    eta_s: float | None = None

    @property
    def format_dict(self) -> dict[str, Any]:
        d = super().format_dict
        left = d["total"] - d["n"]
        if self.eta_s is not None and left > 0:
            d["rate"] = left / self.eta_s if self.eta_s > 0 else None
        return d


class PhasedBar:
    """One bar for ``phases`` run in order, in units of expected cost (steps x units)."""

    def __init__(self, phases: list[Phase], desc: str = "demo", **tqdm_kwargs: Any):
        self.phases = phases
        self.done = [0] * len(phases)
        self.current = 0
        total = sum(p.steps * p.units for p in phases)
        self.bar = _Bar(
            total=total, desc=desc, bar_format=BAR_FORMAT, dynamic_ncols=True, **tqdm_kwargs
        )
        self._token = None

    def __enter__(self) -> PhasedBar:
        self._token = ACTIVE.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        ACTIVE.reset(self._token)
        self.close()

    def close(self) -> None:
        self.bar.close()  # tqdm's close is idempotent

    def skip(self, name: str, steps: int) -> None:
        """``steps`` of phase ``name`` were done by an earlier process (a resumed run): counted
        as done, not in this process's rate."""
        i = self._index(name)
        units = steps * self.phases[i].units
        self.done[i] += steps
        self.bar.initial += units
        self.bar.n += units
        self.bar.last_print_n = self.bar.n
        self.bar.refresh()

    @contextmanager
    def phase(self, name: str) -> Iterator[PhasedBar]:
        """Phase ``name`` runs: the next :func:`progress_bar` call returns its view."""
        self.current = self._index(name)
        try:
            yield self
        finally:
            self.current = min(self.current + 1, len(self.phases) - 1)

    def view(self, total: int, initial: int = 0) -> _PhaseView:
        """What :func:`progress_bar` returns inside a phase (``initial``: steps done earlier)."""
        i = self.current
        if initial > self.done[i]:
            self.skip(self.phases[i].name, initial - self.done[i])
        self.phases[i].steps = total  # a resumed run may change the step count
        self.bar.total = sum(p.steps * p.units for p in self.phases)
        return _PhaseView(self, i)

    def _index(self, name: str) -> int:
        return [p.name for p in self.phases].index(name)


class _PhaseView:
    """The part of a :class:`PhasedBar` one phase's loop drives: update / set_postfix / write /
    close, as on a tqdm bar."""

    def __init__(self, owner: PhasedBar, index: int):
        self.owner, self.index = owner, index
        self.phase = owner.phases[index]
        self.ran, self.t0 = 0, time.perf_counter()
        self._values: dict[str, Any] = {}
        self.set_postfix()

    def _label(self) -> str:
        n = len(self.owner.phases)
        step = self.owner.done[self.index]
        return f"[{self.index + 1}/{n}] {self.phase.name} {step}/{self.phase.steps}"

    def update(self, n: int = 1) -> None:
        owner = self.owner
        self.ran += n
        owner.done[self.index] += n
        per_unit_s = (time.perf_counter() - self.t0) / (self.ran * self.phase.units)
        owner.bar.eta_s = phased_eta(owner.phases, self.index, owner.done, per_unit_s)
        self.set_postfix(self._values, refresh=False)  # the new step count, shown once below
        owner.bar.update(n * self.phase.units)

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kw: Any):
        self._values = {**(ordered_dict or {}), **kw}
        shown = ", ".join([self._label(), *(f"{k}={v}" for k, v in self._values.items())])
        self.owner.bar.set_postfix_str(shown, refresh=refresh)

    def write(self, message: str, file: Any = None, **kw: Any) -> None:
        self.owner.bar.write(message, file=file, **kw)

    def close(self) -> None:
        """The phase's loop ended; the one bar stays until the run ends."""


def active_view(total: int, initial: int = 0) -> _PhaseView | None:
    """A view of the active phased bar, or None when there is none."""
    owner = ACTIVE.get()
    return None if owner is None else owner.view(total, initial)
