"""Turn a config's engine options into its rollout engine: the engines are declared torch-free
in ``gspo.config.options.ROLLOUT_ENGINES`` (a name, the module that implements it), and each
engine's module is imported here only when a run checks or builds that engine (so vLLM's
module, and its package, load only for a vLLM run); ``policy_engine`` builds a training run's.

The engine's options are plain data (``gspo.config.options.EngineOptions``, ``cfg.engine`` of a
``TrainConfig``, where its fields are declared) and check themselves (``EngineOptions.problems``).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import ModuleType
from typing import Any

import torch

from gspo.config.options import ROLLOUT_ENGINES, EngineKind, EngineOptions
from gspo.config.train import TrainConfig
from gspo.models.policy import DTYPES
from gspo.rollout.base import EngineBuild


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
        and engine_kind(cfg.engine).own_memory
        and cuda
    )


def engine_kind(engine: EngineOptions) -> EngineKind:
    """The declared engine the options name."""
    return ROLLOUT_ENGINES[engine.rollout_engine]


def engine_module(engine: EngineOptions) -> ModuleType:
    """The module of the engine the options name (its ``require`` and ``build``)."""
    return importlib.import_module(engine_kind(engine).module)


def check_engine_available(engine: EngineOptions) -> None:
    """Fail before any work when the configured engine cannot run here."""
    engine_module(engine).require()


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
    return engine_module(engine).build(build)


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
        compiled=cfg.optim.compile,
    )


def close_engine(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()
