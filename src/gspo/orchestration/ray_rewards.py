"""Rewards scored in Ray tasks: the batch in contiguous chunks, one task of 1 CPU each.

A slow reward (the code sandbox: one subprocess per completion, ~0.15 s) scored one after
another in the driver holds the whole step; ``reward_workers`` threads in the driver use only
the driver's machine. With ``reward_placement='ray'`` (``auto`` picks it for sandboxed rewards
on ``backend='ray'``) each chunk is scored by :func:`gspo.envs.rewards.score` inside a Ray
task, so the work spreads over the cluster's free CPUs. Inside a task the reward runs exactly
as in the driver (the same ``timeout_s`` wrapper, the same failure rules), so rewards and
``reward/errors`` equal the driver's; a task that dies as a whole (its worker killed) scores
its chunk 0.0 and counts every completion of it as an error, as a reward that raised would.

The reward function travels once per run (an object-store reference per function); it and the
examples must be picklable (cloudpickle: module-level functions, ``functools.partial``,
closures); :class:`RayScorer` checks this when it is built, before any work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from gspo.config.train import TrainConfig

from ..envs.rewards import score_each, uses_sandbox

logger = logging.getLogger(__name__)


def use_ray_tasks(cfg: TrainConfig, reward_fn: Any) -> bool:
    """Whether ``reward_placement`` (with ``auto`` resolved) sends rewards to Ray tasks."""
    if cfg.backend.backend != "ray" or cfg.backend.reward_placement == "driver":
        return False
    return cfg.backend.reward_placement == "ray" or uses_sandbox(reward_fn)


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` (at most ``n``) contiguous near-equal [start, end) ranges covering range(n)."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _score_chunk(
    reward_fn: Any, completions: list[str], examples: list[Any], timeout_s: float | None
) -> list[float | None]:
    """(Ray task) :func:`gspo.envs.rewards.score_each` of one chunk, one call after another."""
    return score_each(reward_fn, completions, examples, timeout_s=timeout_s)


class RayScorer:
    """:func:`gspo.envs.rewards.score_each` in ``tasks`` Ray tasks at once (:meth:`each`)."""

    def __init__(self, ray: Any, tasks: int, reward_fns: Sequence[Any] = ()):
        if tasks < 1:
            raise ValueError(f"RayScorer needs tasks >= 1, got {tasks}")
        self.ray, self.tasks = ray, tasks
        # max_retries=0: a chunk whose worker died is scored as errors, not run twice.
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_score_chunk)
        self._refs: dict[int, tuple[Any, Any]] = {}
        for fn in reward_fns:  # fail now, naming the reward, rather than at step 1
            self._ref(fn)

    def _ref(self, reward_fn: Any) -> Any:
        """The reward's object-store reference (put once; kept with the function itself so
        that its id cannot be reused by another object)."""
        key = id(reward_fn)
        if key not in self._refs:
            try:
                ref = self.ray.put(reward_fn)
            except Exception as err:
                name = getattr(reward_fn, "__name__", repr(reward_fn))
                raise ValueError(
                    f"reward_placement='ray': the reward {name} cannot be sent to Ray tasks "
                    f"({type(err).__name__}: {err}); make it a module-level function or a "
                    "functools.partial of one, or set reward_placement='driver'"
                ) from err
            self._refs[key] = (reward_fn, ref)
        return self._refs[key][1]

    def each(
        self,
        reward_fn: Any,
        completions: Sequence[str],
        examples: Sequence[Any],
        *,
        timeout_s: float | None = None,
        workers: int = 1,
    ) -> list[float | None]:
        """The rewards one by one as :func:`~gspo.envs.rewards.score_each` (None: failed), the
        signature a :class:`~gspo.envs.base.SingleTurnEnv` scores a round with; ``workers`` is
        unused (the number of tasks is fixed when the scorer is built)."""
        if len(completions) != len(examples):
            raise ValueError(
                f"{len(completions)} completions but {len(examples)} examples; they must pair up"
            )
        fn = self._ref(reward_fn)
        bounds = chunk_bounds(len(completions), self.tasks)
        refs = [
            self._remote.remote(fn, list(completions[a:b]), list(examples[a:b]), timeout_s)
            for a, b in bounds
        ]
        rewards: list[float | None] = []
        for ref, (a, b) in zip(refs, bounds, strict=True):
            try:
                values = self.ray.get(ref)
            except self.ray.exceptions.RayError as err:  # the task's worker died, not a reward
                logger.warning(
                    "reward task for completions %d-%d failed (%s): scored 0 and counted as errors",
                    a,
                    b - 1,
                    type(err).__name__,
                )
                values = [None] * (b - a)
            rewards.extend(values)
        return rewards
