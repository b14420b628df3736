"""One FSDP2 training rank (a Ray actor): the trainer's own update, sharded over N ranks.

Each rank builds the same policy from the driver's weights, wraps it with ``fully_shard`` and
runs :func:`gspo.backend.update.update_policy` on its share of every minibatch
(``shard=(rank, N)``).
The sequence and token denominators are those of the whole minibatch, and FSDP2's gradient
reduce-scatter sums (divide factor 1) instead of averaging, so the summed gradient equals one
process's; ``clip_grad_norm_`` on DTensor gradients clips on the global norm. gloo on CPU,
NCCL on GPU. The driver side is :class:`gspo.backend.ray_backend.RayFSDPBackend`.

Every forward of a sharded model is a collective (its layers are all-gathered), so every
method that runs one must be called on all ranks at once, with the same number of passes.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed import TCPStore
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from ..models.logprobs import token_logprobs
from ..models.policy import build_policy, set_threads
from ..models.vision import is_vision_model
from ..rollout.base import PIXELS, Rollout, RolloutBatch
from .accumulator import Accumulator
from .options import reference_logprobs, reward_kl_penalty
from .ray_refs import with_pixels
from .reshard import load_dcp_into
from .update import _frozen_copy, build_optimizer, update_policy

COLLECTIVE_TIMEOUT_S = 300
"""A rank waiting on a dead peer gives up after this long (gloo's default is 30 minutes); the
driver notices a dead rank sooner, from Ray."""


class FSDPRank:
    """One training rank (run as a Ray actor): model shard, optimizer, schedule, reference."""

    def __init__(self, cfg, rank: int, world: int):
        set_threads(cfg.run.threads)
        self.cfg, self.rank, self.world = cfg, rank, world
        cuda = cfg.run.device.startswith("cuda") or (
            cfg.run.device == "auto" and torch.cuda.is_available()
        )
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # Ray: 1 GPU each

    def rendezvous(self) -> str:
        """(Rank 0) ``tcp://IP:PORT`` where the process group meets: rank 0's TCP store, already
        listening on a port the OS picked (no window in which another process can take a
        port found free), on the node's address so that ranks on other nodes reach it."""
        import ray

        ip = ray.util.get_node_ip_address()
        self._store = TCPStore(
            ip, 0, self.world, is_master=True, wait_for_workers=False,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )  # fmt: skip
        return f"tcp://{ip}:{self._store.port}"

    def setup(self, init_method: str, state: dict[str, torch.Tensor]) -> None:
        """Join the process group, build the policy from the driver's weights, shard it."""
        cfg = self.cfg
        torch.manual_seed(cfg.run.seed)
        timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        store = getattr(self, "_store", None)  # rank 0 holds the listening store
        if store is None:
            host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
            store = TCPStore(host, int(port), self.world, is_master=False, timeout=timeout)
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo",
            store=store,
            rank=self.rank,
            world_size=self.world,
            timeout=timeout,
        )
        model, _ = build_policy(cfg.model, self.device, seed=cfg.run.seed)
        model.load_state_dict(state)
        # The frozen reference stays whole on every rank: no collectives, used row by row.
        self.ref_model = _frozen_copy(model) if cfg.loss.kl_coef > 0 else None
        if cfg.backend.activation_checkpointing:  # recompute each layer in backward (HF's wrapper)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        shard_kw = {}
        if cfg.backend.fsdp_param_dtype is not None:  # compute in bf16/fp16, reduce in fp32
            shard_kw["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=getattr(torch, cfg.backend.fsdp_param_dtype), reduce_dtype=torch.float32
            )
        # A VL model's decoder layers are its text model's; the vision tower and connector go
        # with the rest (the root unit).
        decoder = model.model.text_model if is_vision_model(model) else model.model
        for layer in decoder.layers:  # one all-gather per decoder layer, then the rest
            fully_shard(layer, **shard_kw)
        fully_shard(model, **shard_kw)
        # Sum the ranks' parts (the denominators are already global). gloo has no PREMUL_SUM:
        # a plain SUM reduce-scatter with a post-divide of 1 is that sum.
        for module in model.modules():  # each fully_shard unit has its own setting
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        self.model = model
        # Fused as the local backend (CPU and CUDA): DTensor shards take it too.
        self.optimizer, self.scheduler = build_optimizer(cfg.optim, model, fused=True)

    def pid(self) -> int:
        return os.getpid()

    def old_logprobs(self, rollout: Rollout) -> torch.Tensor:
        """[n_r, L] recomputed log-probs of this rank's rows ``rank::world`` (one forward on
        every rank: a rank without rows runs one on row 0 and returns none). Image prompts:
        each row gets its prompt's pixel inputs, read from the object store."""
        rollout = with_pixels(rollout).to(self.device)
        rows = torch.arange(rollout.num_samples)[self.rank :: self.world]  # [n_r]
        run = rows if len(rows) else torch.zeros(1, dtype=torch.long)
        pixels = rollout.extras.get(PIXELS)
        # Text rows keep the plain forward they always had (no prompt_index).
        vision = (
            {} if pixels is None else {"pixels": pixels, "prompt_index": rollout.prompt_index[run]}
        )
        with torch.no_grad():
            logprobs, _ = token_logprobs(
                self.model,
                rollout.prompt_ids[run],
                rollout.prompt_mask[run],
                rollout.completion_ids[run],
                rollout.completion_mask[run],
                temperature=self.cfg.rollout.temperature,
                **vision,
            )  # [n_r, L]
        return logprobs[: len(rows)].cpu()

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor | None:
        """[N, L] reference log-probs (the reference is whole: one rank is enough)."""
        ref = reference_logprobs(self.cfg, self.ref_model, with_pixels(rollout))
        return None if ref is None else ref.cpu()  # [N, L]

    def kl_penalty(self, rollout: Rollout, old_logprobs: torch.Tensor):
        return reward_kl_penalty(self.cfg, self.ref_model, with_pixels(rollout), old_logprobs)

    def update(self, batch: RolloutBatch) -> dict[str, Any]:
        """This rank's share of the update: its raw metric sums (merged by the driver) and
        the learning rate after it (one round trip)."""
        # The batch comes from the driver on CPU (its pixel inputs by reference); a GPU rank
        # works on its own device.
        batch = replace(batch, rollout=with_pixels(batch.rollout)).to(self.device)
        acc = Accumulator()
        update_policy(
            self.cfg,
            self.model,
            self.ref_model,
            self.optimizer,
            self.scheduler,
            batch,
            shard=(self.rank, self.world),
            acc=acc,
        )
        return {"metrics": vars(acc), "lr": self.scheduler.get_last_lr()[0]}

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The gathered full weights on CPU (rank 0 returns them; every rank must call)."""
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=opts)
        return state if self.rank == 0 else None

    def save(self, directory: str) -> None:
        """Sharded weights and optimizer state with torch.distributed.checkpoint (every rank
        writes its own shard under ``directory/dcp``); rank 0 adds the LR schedule."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=f"{directory}/dcp")
        if self.rank == 0:
            torch.save(self.scheduler.state_dict(), Path(directory) / "scheduler.pt")

    def load(self, directory: str) -> None:
        """Restore what :meth:`save` wrote, with any number of ranks (DCP reshards)."""
        load_dcp_into(self.model, self.optimizer, Path(directory) / "dcp")
        saved = torch.load(Path(directory) / "scheduler.pt", weights_only=False)
        self.scheduler.load_state_dict(saved)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
