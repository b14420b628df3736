"""The scored rollout batch: one type from generation through reward, advantages and update.

A step's rows (N = prompts x group size, group after group) start as the engine's or the
episode driver's :class:`~gspo.rollout.base.Rollout`; the environment scores them (rewards,
per-turn advantages for ``credit='turn'``), dynamic sampling and the async buffer keep some of
their rows (:meth:`RolloutBatch.select`), and the trainer adds the old log-probs, the mismatch
weights, the group advantages and the step before the update reads them. Single- and multi-turn
episodes, synchronous and async, all hand this one object along.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .base import Rollout


@dataclass
class RolloutBatch:
    """One step's scored rollout, row-aligned (N rows); each stage fills in its fields."""

    rollout: Rollout
    """Tokens and masks, the engine's log-probs [N, L], per-token policy versions
    (``versions``), the environment-token mask (``loss_mask``), per-token turns and per-row
    versions of episodes (``extras``)."""
    rewards: torch.Tensor  # [N] float64 training reward (episode return, less overlong penalty)
    reward_errors: int = 0
    """Failed episodes (a reward or an environment that raised, hung or gave no number)."""
    task_rewards: torch.Tensor | None = None  # [N] the task reward alone, beside a format bonus
    advantages: torch.Tensor | None = None
    """[N] group advantages of the rewards, or [N, L] per-turn credit (``credit='turn'``)."""
    trajectories: list[Any] = field(default_factory=list)
    """The episodes' records (``gspo.envs.trajectory.Trajectory``), one per row when scored."""
    images: Any = None
    """Per-row image inputs of vision-language prompts; None (text only) for now."""
    old_logprobs: torch.Tensor | None = None  # [N, L] the update's old policy
    weights: torch.Tensor | None = None  # [N, L] or [N] mismatch-correction weights
    step: int = 0
    """The RL step whose update trains these rows (seeds its minibatch shuffle); the loop sets
    it before the update."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Reward-side metrics in logging order (dynamic sampling, task reward, async, episodes, KL)."""
    mismatch: dict[str, float] = field(default_factory=dict)
    corrected: dict[str, float] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: rollout (sampling and scoring, or the wait for an async batch),
    recompute, update, sync."""

    @property
    def num_samples(self) -> int:
        return self.rollout.num_samples

    def to(self, device: torch.device) -> RolloutBatch:
        """The batch with what the update reads on ``device`` (rollout, advantages, old
        log-probs, weights). The rewards stay where they were scored (float64 on the CPU):
        the group advantages are computed there and moved, as they always were."""
        moved = {
            k: getattr(self, k).to(device)
            for k in ("advantages", "old_logprobs", "weights")
            if getattr(self, k) is not None
        }
        return replace(self, rollout=self.rollout.to(device), **moved)

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The listed rows [n] (CPU indices), in order; counts and metrics are kept whole."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows.to(t.device)]

        listed = rows.tolist()
        return replace(
            self,
            rollout=self.rollout.select(rows),
            rewards=self.rewards[rows],
            task_rewards=pick(self.task_rewards),
            advantages=pick(self.advantages),
            old_logprobs=pick(self.old_logprobs),
            weights=pick(self.weights),
            trajectories=[self.trajectories[i] for i in listed] if self.trajectories else [],
            images=None if self.images is None else [self.images[i] for i in listed],
            metrics=dict(self.metrics),
            mismatch=dict(self.mismatch),
            corrected=dict(self.corrected),
            times=dict(self.times),
        )
