"""A staleness-bounded buffer of complete groups for asynchronous RL (no threads, no clock).

Versions: the policy version of a set of weights is the number of optimizer steps behind them
(the initial weights are version 0; the trainer at step k holds version k). Every sample
carries the oldest and the newest version among its tokens (a partial rollout continued under
new weights spans several). Its staleness at trainer version v is ``v - oldest``.

Admission rule: a group enters a training batch only if every sample's staleness is <= K
(``max_staleness``). Groups stay whole, because advantages are normalized within a group:

- a stale complete group is dropped, its samples counted in ``dropped_samples``;
- a group still missing samples is never returned; once its step's batch is taken, or once it
  is already stale, it is dropped and counted in ``dropped_partial_samples``.

Groups are keyed by (step, slot): the step they were sampled for (its prompts and random
streams come from that step's seeds) and their place in it. ``take(step, version)`` returns
the admissible complete groups of that step once the producer has closed it. No sample can be
returned twice (a key is taken at most once, a repeated sample is an error), and none is lost
silently (every sample put is either taken or counted as dropped: ``accounted()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Group:
    """One prompt's samples, filled as they arrive."""

    key: tuple[int, int]  # (step, slot)
    size: int
    oldest: dict[int, int] = field(default_factory=dict)  # sample index -> oldest token version
    newest: dict[int, int] = field(default_factory=dict)  # sample index -> newest token version
    payload: Any = None
    """Whatever the producer attaches (the rows of a scored rollout)."""

    @property
    def complete(self) -> bool:
        return len(self.oldest) == self.size

    def staleness(self, trainer_version: int) -> int:
        """Versions the oldest token of the group lags behind ``trainer_version``."""
        return trainer_version - min(self.oldest.values())


@dataclass
class BufferCounters:
    """Cumulative sample counts since the buffer was made."""

    put: int = 0
    taken: int = 0
    dropped_stale: int = 0
    dropped_partial: int = 0


class StalenessBuffer:
    """Complete groups waiting for the trainer; see the module docstring for the rules."""

    def __init__(self, group_size: int, max_staleness: int) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.group_size, self.max_staleness = group_size, max_staleness
        self.groups: dict[tuple[int, int], Group] = {}
        self.closed: set[int] = set()
        self.taken_steps: set[int] = set()
        self.counters = BufferCounters()

    # --- producer side --------------------------------------------------------------------

    def put(self, key: tuple[int, int], index: int, oldest: int, newest: int) -> None:
        """One sample (``index`` in 0..group_size-1) of group ``key`` with its token versions."""
        step = key[0]
        if step in self.taken_steps or step in self.closed:
            raise ValueError(f"step {step} is closed: a sample for it would be counted twice")
        if not 0 <= index < self.group_size:
            raise ValueError(f"sample index {index} outside group of {self.group_size}")
        if oldest > newest:
            raise ValueError(f"oldest version {oldest} > newest {newest}")
        g = self.groups.setdefault(key, Group(key, self.group_size))
        if index in g.oldest:
            raise ValueError(f"sample {index} of group {key} put twice")
        g.oldest[index], g.newest[index] = oldest, newest
        self.counters.put += 1

    def put_group(
        self, key: tuple[int, int], oldest: list[int], newest: list[int], payload: Any = None
    ) -> None:
        """A whole group at once (the usual case: a group is generated in one batch)."""
        if len(oldest) != self.group_size or len(newest) != self.group_size:
            raise ValueError(f"a group has {self.group_size} samples, got {len(oldest)}")
        for i, (lo, hi) in enumerate(zip(oldest, newest, strict=True)):
            self.put(key, i, lo, hi)
        self.groups[key].payload = payload

    def attach(self, key: tuple[int, int], payload: Any) -> None:
        self.groups[key].payload = payload

    def close(self, step: int) -> None:
        """The producer has put everything it will put for ``step``."""
        self.closed.add(step)

    # --- trainer side ---------------------------------------------------------------------

    def ready(self, step: int) -> bool:
        """Whether ``take(step, ...)`` would return now."""
        return step in self.closed

    def evict(self, trainer_version: int) -> None:
        """Drop groups (complete or not) that can no longer be admitted at this version or
        later: their oldest sample is already more than K versions behind."""
        for key in list(self.groups):
            g = self.groups[key]
            if g.oldest and g.staleness(trainer_version) > self.max_staleness:
                self._drop(key, stale=g.complete)

    def take(self, step: int, trainer_version: int) -> list[Group] | None:
        """The admissible complete groups of ``step`` in slot order (possibly fewer than were
        sampled: the rest were dropped and counted), or None while the step is still open."""
        if step in self.taken_steps:
            raise ValueError(f"step {step} was already taken")
        if step not in self.closed:
            return None
        self.evict(trainer_version)
        out: list[Group] = []
        for key in sorted(k for k in self.groups if k[0] == step):
            if self.groups[key].complete:
                out.append(self.groups.pop(key))
                self.counters.taken += self.group_size
            else:
                self._drop(key, stale=False)  # the step is closed: it will never complete
        self.closed.discard(step)
        self.taken_steps.add(step)
        return out

    def drop_all(self) -> int:
        """Drop every group still held (end of run, or a resume that regenerates in-flight
        steps); return the samples dropped (counted)."""
        before = self.counters.dropped_stale + self.counters.dropped_partial
        for key in list(self.groups):
            g = self.groups[key]
            self._drop(key, stale=g.complete)
        self.closed.clear()
        return self.counters.dropped_stale + self.counters.dropped_partial - before

    def accounted(self) -> bool:
        """Every sample put is taken, dropped (counted) or still held: none lost silently."""
        held = sum(len(g.oldest) for g in self.groups.values())
        c = self.counters
        return c.put == c.taken + c.dropped_stale + c.dropped_partial + held

    def _drop(self, key: tuple[int, int], *, stale: bool) -> None:
        g = self.groups.pop(key)
        if stale:
            self.counters.dropped_stale += len(g.oldest)
        else:
            self.counters.dropped_partial += len(g.oldest)


def batch_metrics(groups: list[Group], trainer_version: int) -> dict[str, float]:
    """``async/staleness_mean``, ``async/staleness_max`` (versions behind, per sample, by its
    oldest token) and ``async/partial_fraction`` (samples whose tokens span more than one
    version) of the groups a training batch is made of."""
    stale = [trainer_version - v for g in groups for v in g.oldest.values()]
    spans = [g.newest[i] != g.oldest[i] for g in groups for i in g.oldest]
    if not stale:
        return {
            "async/staleness_mean": 0.0,
            "async/staleness_max": 0,
            "async/partial_fraction": 0.0,
        }
    return {
        "async/staleness_mean": sum(stale) / len(stale),
        "async/staleness_max": max(stale),
        "async/partial_fraction": sum(spans) / len(spans),
    }
