"""The local training backend: the policy update of one batch in this process.

It owns the trainable policy, its AdamW optimizer and LR schedule, the frozen reference model
(when a KL term is on) and their checkpoint. The loop talks to it only through
:class:`~gspo.backend.base.TrainingBackend`, so the FSDP2 ranks on Ray can stand in for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gspo.config.train import TrainConfig

from ..models.logprobs import model_kind
from ..models.model_io import save_model
from ..models.moe import step_metrics as moe_step_metrics
from ..rollout.base import Rollout, RolloutBatch
from .base import CheckpointTarget
from .checkpoint import restore, save_checkpoint
from .options import reference_logprobs, reward_kl_penalty
from .reshard import is_sharded, restore_sharded
from .update import _frozen_copy, _old_logprobs, build_optimizer, update_policy


class LocalBackend:
    """:class:`~gspo.backend.base.TrainingBackend` for one process (CPU or one GPU)."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, device: torch.device) -> None:
        self.cfg, self.model, self.device = cfg, model, device
        # Copied from the freshly built policy, before any restore: a resumed run keeps the
        # reference weights an unbroken run would use.
        self.ref_model = _frozen_copy(model) if cfg.loss.kl_coef > 0 else None
        # Fused where torch has the kernel (CPU, CUDA); elsewhere torch's default.
        fused = device.type in ("cpu", "cuda") or None
        self.optimizer, self.scheduler = build_optimizer(cfg.optim, model, fused=fused)

    def old_logprobs(self, rollout: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        return _old_logprobs(self.cfg, self.model, rollout)  # [N, L], mismatch/*

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor | None:
        return reference_logprobs(self.cfg, self.ref_model, rollout)  # [N, L]

    def kl_penalty(
        self, rollout: Rollout, old_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """(β Σ_t KL_t per sequence [N], metrics) with ``kl_in_reward``; (None, {}) otherwise."""
        return reward_kl_penalty(self.cfg, self.ref_model, rollout, old_logprobs)

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        return update_policy(
            self.cfg, self.model, self.ref_model, self.optimizer, self.scheduler, batch
        )

    def push_weights(self, engine: Any) -> None:
        engine.update_weights(self.model)  # a torch engine sharing the model: nothing to copy

    def step_metrics(self, rollout: Rollout) -> dict[str, float]:
        # MoE: share of expert choices the update changed, on this rollout ({} for dense models).
        return moe_step_metrics(self.model, rollout) if model_kind(self.model).moe else {}

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def save_checkpoint(self, target: CheckpointTarget, step: int, extra: dict[str, Any]) -> Path:
        return save_checkpoint(target, step, self.model, self.optimizer, self.scheduler, extra)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        if is_sharded(path):  # written by the Ray backend's ranks: read their shards here
            return restore_sharded(
                path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
            )
        return restore(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)

    def export(self, directory: Path, tokenizer: Any) -> None:
        save_model(self.model, tokenizer, directory)  # LoRA: merged, adapter in adapter/

    def close(self) -> None:
        """Nothing to release: the model lives in this process."""
