"""FSDP2 training ranks in Ray actors: the trainer's own update, sharded over N gloo ranks.

Each rank builds the same policy from the driver's weights, wraps it with ``fully_shard`` and
runs :func:`gspo.backend.update.update_policy` on its share of every minibatch (``shard=(rank, N)``).
The sequence and token denominators are those of the whole minibatch, and FSDP2's gradient
reduce-scatter sums (divide factor 1) instead of averaging, so the summed gradient equals one
process's; ``clip_grad_norm_`` on DTensor gradients clips on the global norm.
"""

from __future__ import annotations

from typing import Any

import torch

from ..rollout.base import Rollout


class FSDPRank:
    """One training rank (run as a Ray actor): model shard, optimizer, schedule."""

    def __init__(self, cfg, rank: int, world: int, port: int, state: dict[str, torch.Tensor]):
        import torch.distributed as dist
        from torch.distributed.fsdp import FSDPModule, fully_shard

        from ..build import build_policy
        from .update import lr_lambda

        torch.manual_seed(cfg.seed)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        self.cfg, self.rank, self.world = cfg, rank, world
        model, _ = build_policy(cfg, torch.device("cpu"))
        model.load_state_dict(state)
        for layer in model.model.layers:  # one all-gather per decoder layer, then the rest
            fully_shard(layer)
        fully_shard(model)
        # Sum the ranks' parts (the denominators are already global). gloo has no PREMUL_SUM:
        # a plain SUM reduce-scatter with a post-divide of 1 is that sum.
        for module in model.modules():  # each fully_shard unit has its own setting
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        self.model = model
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.warmup_steps)
        )

    def update(self, rollout, old, advantages, step, weights=None) -> dict[str, float]:
        from .update import update_policy

        return update_policy(
            self.cfg,
            self.model,
            None,
            self.optimizer,
            self.scheduler,
            rollout,
            old,
            advantages,
            step,
            weights,
            shard=(self.rank, self.world),
        )

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The gathered full weights on CPU (rank 0 returns them; every rank must call)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=opts)
        return state if self.rank == 0 else None

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayFSDPBackend:
    """The policy update over ``cfg.trainer_workers`` FSDP2 ranks placed by Ray (partial
    :class:`~gspo.backend.base.TrainingBackend`: update, weights, close)."""

    def __init__(self, cfg, model: torch.nn.Module, workers: int, address: str | None = None):
        from .ray_cluster import free_port, start_ray

        self.ray = start_ray(address, num_cpus=workers)
        port = free_port()
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        actor = self.ray.remote(num_cpus=1)(FSDPRank)
        self.ranks = [
            actor.options(name=None).remote(cfg, r, workers, port, state) for r in range(workers)
        ]
        self._metrics: dict[str, float] = {}

    def update(
        self,
        rollout: Rollout,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        step: int,
        weights: torch.Tensor | None = None,
    ) -> dict[str, float]:
        args = (rollout, old_logprobs, advantages, step, weights)
        results = self.ray.get([r.update.remote(*args) for r in self.ranks])
        return results[0]  # rank 0's metrics (its share of the rows)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.ray.get([r.full_state_dict.remote() for r in self.ranks])[0]

    def push_weights(self, engine: Any) -> None:
        engine.update_weights(self.full_state_dict())

    def close(self) -> None:
        try:
            self.ray.get([r.close.remote() for r in self.ranks], timeout=30)
        finally:
            for r in self.ranks:
                self.ray.kill(r)
            self.ranks = []
