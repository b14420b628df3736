"""The training-backend protocol: what the loop asks of whoever holds the trainable policy.

A backend owns the policy's weights, its optimizer and LR schedule, the frozen reference model
(KL), and their checkpoint. The loop hands it the step's
:class:`~gspo.rollout.base.RolloutBatch` and gets metrics back; it never touches the model
itself. The local backend runs in this process; the FSDP2 backend shards the
same update over N ranks (all-reduced sequence and token denominators, so the update equals
one process's), placed by Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from ..rollout.base import Rollout, RolloutBatch


@dataclass(frozen=True)
class CheckpointTarget:
    """Where a run's checkpoints go and what each holds beside the backend's own state: the
    same for every checkpoint of the run."""

    output_dir: Path
    """The run folder: checkpoints are written under its ``checkpoints/``."""
    tokenizer: Any
    """Saved with the weights (None: none saved)."""
    config: dict[str, Any]
    """The run's config, in the checkpoint's state.json."""
    keep: int
    """How many of the newest checkpoints stay (older ones are pruned)."""


@runtime_checkable
class TrainingBackend(Protocol):
    """The policy update of one batch, wherever the ranks are."""

    def old_logprobs(self, rollout: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """[N, L] old log-probs for the loss: the engine's own (``old_logprobs='engine'``) or a
        recompute pass of the current weights, with the ``mismatch/*`` metrics of that pass."""
        ...

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor | None:
        """[N, L] log-probs of the frozen reference model (None when no KL term is on)."""
        ...

    def kl_penalty(
        self, rollout: Rollout, old_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """(β Σ_t KL_t per sequence [N] float64, metrics) for ``kl_in_reward``; (None, {})
        when the KL term is off or sits in the loss."""
        ...

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """``num_minibatches`` optimizer steps over the batch; the loss/clip/grad metrics.

        Reads the batch's rollout, ``old_logprobs`` [N, L], ``advantages`` ([N] or [N, L]),
        ``weights`` (detached correction weights, [N] or [N, L], or None) and ``step``.
        """
        ...

    def push_weights(self, engine: Any) -> None:
        """Give the rollout engine(s) the current weights (nothing to do for a shared model)."""
        ...

    def step_metrics(self, rollout: Rollout) -> dict[str, float]:
        """Per-step policy metrics beyond the update's (MoE routing change; {} for dense)."""
        ...

    def lr(self) -> float:
        """The learning rate of the last optimizer step."""
        ...

    def save_checkpoint(self, target: CheckpointTarget, step: int, extra: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step`` under ``target.output_dir`` atomically (weights,
        optimizer, schedule, RNG, ``extra``: the loop's state) and prune all but the
        ``target.keep`` newest."""
        ...

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote; return its state (``step`` + ``extra``)."""
        ...

    def export(self, directory: Path, tokenizer: Any) -> None:
        """The final model as a Hugging Face folder (full weights, gathered from every rank)."""
        ...

    def close(self) -> None:
        """Release ranks, process groups and actors; no process may outlive this call."""
        ...
