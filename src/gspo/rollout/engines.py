"""Turn a config's engine options into its rollout engine: the registry of engines (``ENGINES``:
the torch engine, or vLLM, whose package is imported only when its engine starts) and the call
that builds a training run's engine (``policy_engine``).

The engine's options are plain data (``gspo.config.options.EngineOptions``, ``cfg.engine`` of a
``TrainConfig``, where its fields are declared) and check themselves (``EngineOptions.problems``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from gspo.config.fields import ROLLOUT_ENGINES
from gspo.config.names import declared
from gspo.config.options import EngineOptions
from gspo.config.train import TrainConfig
from gspo.models.policy import DTYPES
from gspo.rollout.torch_engine import TorchEngine
from gspo.rollout.vllm_engine import VLLMEngine, VLLMOptions, require_vllm


def vllm_options(engine: EngineOptions, *, sleep_mode: bool = False):
    """The :class:`gspo.rollout.vllm_engine.VLLMOptions` of the engine options."""
    return VLLMOptions(
        dtype=engine.vllm_dtype,
        max_model_len=engine.vllm_max_model_len,
        gpu_memory_utilization=engine.vllm_gpu_memory_utilization,
        enforce_eager=engine.vllm_enforce_eager,
        tensor_parallel_size=engine.vllm_tensor_parallel_size,
        cpu_kv_cache_gib=engine.vllm_cpu_kv_cache_gib,
        multiprocess=engine.vllm_multiprocess,
        sleep_mode=sleep_mode,
    )


def colocated_sleep(cfg: TrainConfig) -> bool:
    """Whether the rollout engine sleeps while the trainer updates: only on the Ray backend with
    colocated placement (training and rollout share the GPUs), an engine that holds its own copy
    of the weights (vLLM) and CUDA. vLLM has no sleep on CPU (a warning) and the torch engine
    holds no separate memory."""
    device = cfg.run.device
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return (
        cfg.backend.backend == "ray"
        and cfg.backend.placement == "colocated"
        and engine_spec(cfg.engine).own_memory
        and cuda
    )


@dataclass(frozen=True)
class EngineBuild:
    """What a registered engine is built from: :func:`build_engine`'s arguments."""

    engine: EngineOptions
    model: Any
    tokenizer: Any
    seed: int
    logprobs: bool
    pad_id: int
    eos_id: int
    sleep_mode: bool
    torch_kw: dict[str, Any]
    """The torch engine's own keywords (``dtype``, ``share_weights``)."""


def _torch_engine(b: EngineBuild):
    return TorchEngine(
        b.model, pad_id=b.pad_id, eos_id=b.eos_id, tokenizer=b.tokenizer, **b.torch_kw
    )


def _vllm_engine(b: EngineBuild):
    # vllm_engine imports the vllm package only when an engine starts (an optional extra).
    return VLLMEngine(
        b.model,
        pad_id=b.pad_id,
        eos_id=b.eos_id,
        options=vllm_options(b.engine, sleep_mode=b.sleep_mode),
        tokenizer=b.tokenizer,
        seed=b.seed,
        logprobs=b.logprobs,
    )


@dataclass(frozen=True)
class EngineSpec:
    """A registered rollout engine."""

    build: Callable[[EngineBuild], Any]
    """The engine from its :class:`EngineBuild`."""
    require: Callable[[], None] = lambda: None
    """Fails with an install hint when the engine's optional package is missing."""
    own_memory: bool = False
    """Whether the engine holds its own copy of the weights (so it may sleep on shared GPUs)."""


ENGINES: dict[str, EngineSpec] = declared(
    ROLLOUT_ENGINES,
    {
        "torch": EngineSpec(_torch_engine),
        "vllm": EngineSpec(_vllm_engine, require=require_vllm, own_memory=True),
    },
    "rollout engines",
)
"""Rollout engines by ``rollout_engine`` name, the names ``gspo.config.fields.ROLLOUT_ENGINES``
declares (torch-free, for config checks)."""


def engine_spec(engine: EngineOptions) -> EngineSpec:
    """The registered engine the options name."""
    return ENGINES[engine.rollout_engine]


def check_engine_available(engine: EngineOptions) -> None:
    """Fail before any work when the configured engine cannot be imported."""
    engine_spec(engine).require()


def build_engine(
    engine: EngineOptions,
    model: Any,
    tokenizer: Any,
    *,
    seed: int,
    logprobs: bool,
    pad_id: int,
    eos_id: int,
    sleep_mode: bool = False,
    **torch_kw,
):
    """The configured rollout engine for ``model``: ``TorchEngine(model, **torch_kw)`` or a
    ``VLLMEngine`` started from the model's current weights (``logprobs``: training, which
    reads them; evaluation samples with top-p < 1 and no log-probs)."""
    build = EngineBuild(
        engine, model, tokenizer, seed, logprobs, pad_id, eos_id, sleep_mode, torch_kw
    )
    return engine_spec(engine).build(build)


def policy_engine(cfg: TrainConfig, model: Any, tokenizer: Any, rollout_engine: str | None = None):
    """A training run's engine on its policy ``model`` (log-probs on; vLLM sleeps through updates
    when colocated): pad and eos from the tokenizer; the torch engine shares the policy's
    weights, or keeps its own copy in ``engine_dtype``. ``rollout_engine`` names another engine
    than the configured one (the async driver's torch engine), with the same options."""
    engine = cfg.engine
    if rollout_engine is not None:
        engine = replace(engine, rollout_engine=rollout_engine)
    dtype = engine.engine_dtype
    return build_engine(
        engine,
        model,
        tokenizer,
        seed=cfg.run.seed,
        logprobs=True,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        sleep_mode=engine is cfg.engine and colocated_sleep(cfg),
        dtype=DTYPES[dtype] if dtype else None,
        share_weights=dtype is None,
    )


def close_engine(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()
