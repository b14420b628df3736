"""The update's input in tests: the loop's batch with old log-probs, advantages and a step.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import torch

from gspo.rollout.base import RolloutBatch


def update_batch(rollout, old_logprobs, advantages, step: int = 0, weights=None) -> RolloutBatch:
    """What ``TrainingBackend.update`` takes: ``rollout`` scored with ``advantages`` ([N] or
    [N, L]), its old log-probs [N, L], correction ``weights`` and the ``step`` that trains it.
    The rewards are zeros: the update reads the advantages only."""
    rewards = torch.zeros(rollout.num_samples, dtype=torch.float64)  # [N]
    return RolloutBatch(
        rollout,
        rewards,
        advantages=advantages,
        old_logprobs=old_logprobs,
        weights=weights,
        step=step,
    )
