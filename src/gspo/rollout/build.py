"""Turn a config's engine fields into its rollout engine: the registry of engines (``ENGINES``:
the torch engine, or vLLM, whose package is imported only when its engine starts) and the call
that builds a training run's engine (``policy_engine``).

The engine's config fields are plain data in ``gspo.config.fields`` (``EngineFields``) and their
checks are in ``gspo.config.validation`` (``validate_engine``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gspo.models.build import DTYPES
from gspo.rollout.torch_engine import TorchEngine
from gspo.rollout.vllm_engine import VLLMEngine, VLLMOptions, require_vllm


def vllm_options(cfg: Any):
    """The :class:`gspo.rollout.vllm_engine.VLLMOptions` of a config."""
    return VLLMOptions(
        dtype=cfg.vllm_dtype,
        max_model_len=cfg.vllm_max_model_len,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        enforce_eager=cfg.vllm_enforce_eager,
        tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib,
        multiprocess=cfg.vllm_multiprocess,
        sleep_mode=colocated_sleep(cfg),
    )


def colocated_sleep(cfg: Any) -> bool:
    """Whether the rollout engine sleeps while the trainer updates: only on the Ray backend with
    colocated placement (training and rollout share the GPUs), an engine that holds its own copy
    of the weights (vLLM) and CUDA. vLLM has no sleep on CPU (a warning) and the torch engine
    holds no separate memory."""
    device = str(getattr(cfg, "device", "cpu"))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return (
        getattr(cfg, "backend", "local") == "ray"
        and getattr(cfg, "placement", "separate") == "colocated"
        and engine_spec(cfg).own_memory
        and cuda
    )


def _torch_engine(cfg: Any, model: Any, tokenizer: Any, *, pad_id: int, eos_id: int, **torch_kw):
    return TorchEngine(model, pad_id=pad_id, eos_id=eos_id, tokenizer=tokenizer, **torch_kw)


def _vllm_engine(cfg: Any, model: Any, tokenizer: Any, *, pad_id: int, eos_id: int, **_torch_kw):
    # vllm_engine imports the vllm package only when an engine starts (an optional extra).
    return VLLMEngine(
        model,
        pad_id=pad_id,
        eos_id=eos_id,
        options=vllm_options(cfg),
        tokenizer=tokenizer,
        seed=cfg.seed,
        logprobs=hasattr(cfg, "old_logprobs"),
    )


@dataclass(frozen=True)
class EngineSpec:
    """A registered rollout engine."""

    build: Callable[..., Any]
    """``build(cfg, model, tokenizer, *, pad_id, eos_id, **torch_kw)`` -> the engine."""
    require: Callable[[], None] = lambda: None
    """Fails with an install hint when the engine's optional package is missing."""
    own_memory: bool = False
    """Whether the engine holds its own copy of the weights (so it may sleep on shared GPUs)."""


ENGINES: dict[str, EngineSpec] = {
    "torch": EngineSpec(_torch_engine),
    "vllm": EngineSpec(_vllm_engine, require=require_vllm, own_memory=True),
}
"""Rollout engines by ``rollout_engine`` name (``gspo.config.fields.ROLLOUT_ENGINES`` is its
torch-free copy for config checks; tests/test_config_names.py keeps the two equal)."""


def engine_spec(cfg: Any) -> EngineSpec:
    """The registered engine a config names (configs without the field: the torch engine)."""
    return ENGINES[getattr(cfg, "rollout_engine", "torch")]


def check_engine_available(cfg: Any) -> None:
    """Fail before any work when the configured engine cannot be imported."""
    engine_spec(cfg).require()


def build_engine(cfg: Any, model: Any, tokenizer: Any, *, pad_id: int, eos_id: int, **torch_kw):
    """The configured rollout engine for ``model``: ``TorchEngine(model, **torch_kw)`` or a
    ``VLLMEngine`` started from the model's current weights (top-p < 1 allowed only outside
    training, where log-probs are not used)."""
    return engine_spec(cfg).build(cfg, model, tokenizer, pad_id=pad_id, eos_id=eos_id, **torch_kw)


def policy_engine(cfg: Any, model: Any, tokenizer: Any):
    """A training run's engine on its policy ``model``: pad and eos from the tokenizer; the
    torch engine shares the policy's weights, or keeps its own copy in ``engine_dtype``."""
    return build_engine(
        cfg,
        model,
        tokenizer,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        dtype=DTYPES[cfg.engine_dtype] if cfg.engine_dtype else None,
        share_weights=cfg.engine_dtype is None,
    )


def close_engine(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()
