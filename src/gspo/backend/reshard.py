"""Checkpoints across layouts: a sharded (DCP) checkpoint of N FSDP2 ranks into one process,
and a local checkpoint into DCP form for the ranks.

torch.distributed.checkpoint stores each tensor with its global shape and the pieces each rank
wrote, keyed by parameter name (``model.<fqn>``, ``optim.state.<fqn>.exp_avg``, ...), so a
reader with another sharding (M ranks, or one process without a process group) reads the
pieces it needs. ``get_state_dict`` / ``set_state_dict`` turn a model and optimizer (plain or
FSDP2) into that name-keyed form and back. The local backend's own format (``optimizer.pt``,
keyed by parameter index) is converted through the same form.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from gspo.config.train import TrainConfig

from .checkpoint import load_state, set_rng_state


def is_sharded(path: Path) -> bool:
    """Whether the checkpoint at ``path`` was written by the Ray backend (DCP shards)."""
    return (Path(path) / "dcp").is_dir()


def load_dcp_into(model: torch.nn.Module, optimizer: torch.optim.Optimizer, dcp_dir: Path) -> None:
    """Weights and optimizer state of a DCP folder into ``model`` / ``optimizer`` (plain or
    FSDP2-sharded: each reads the pieces of its own layout)."""
    # get_state_dict also creates the optimizer's state (zeros) so that DCP has tensors to fill.
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    with warnings.catch_warnings():  # one process without a process group: intended
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=str(dcp_dir))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def restore_sharded(path: Path, *, model, optimizer, scheduler) -> dict[str, Any]:
    """The local backend's :func:`gspo.backend.checkpoint.restore` for a Ray checkpoint:
    weights, optimizer, schedule and RNG state; returns its state.json."""
    path = Path(path)
    load_dcp_into(model, optimizer, path / "dcp")
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return load_state(path)


def local_to_dcp(path: Path, model: torch.nn.Module, cfg: TrainConfig, into: Path) -> None:
    """Write a local checkpoint's weights and optimizer state under ``into/dcp`` (and its
    schedule as ``into/scheduler.pt``), the layout :meth:`FSDPRank.load` reads. ``model``: a
    plain policy of the run's architecture (its weights are replaced by the checkpoint's)."""
    path = Path(path)
    if not (path / "model.safetensors").is_file() or not (path / "optimizer.pt").is_file():
        raise ValueError(
            f"checkpoint {path} has neither dcp/ (Ray backend) nor model.safetensors and "
            "optimizer.pt (local backend): it cannot be resumed"
        )
    weights = load_file(str(path / "model.safetensors"))
    model.load_state_dict(weights, strict=False)  # tied lm_head: stored once
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    # The optimizer the local backend builds (backend.local), to read its index-keyed state.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.optim.lr, betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2)
    )
    optimizer.load_state_dict(
        torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
    )
    model_state, optim_state = get_state_dict(model, optimizer)
    with warnings.catch_warnings():  # the driver, without a process group: intended
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(into / "dcp"))
    shutil.copy(path / "scheduler.pt", into / "scheduler.pt")
