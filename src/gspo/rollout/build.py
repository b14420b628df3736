"""Turn a config's engine fields into its rollout engine (the torch engine, or vLLM imported lazily).

The engine's config fields are plain data in ``gspo.config.fields`` (``EngineFields``) and their
checks are in ``gspo.config.validation`` (``validate_engine``).
"""

from __future__ import annotations

from typing import Any


def vllm_options(cfg: Any):
    """The :class:`gspo.rollout.vllm_engine.VLLMOptions` of a config."""
    from gspo.rollout.vllm_engine import VLLMOptions

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
    """Whether the vLLM engine sleeps while the trainer updates: only on the Ray backend with
    colocated placement (training and rollout share the GPUs), the vLLM engine and CUDA. vLLM
    has no sleep on CPU (a warning) and the torch engine holds no separate memory."""
    import torch

    device = str(getattr(cfg, "device", "cpu"))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return (
        getattr(cfg, "backend", "local") == "ray"
        and getattr(cfg, "placement", "separate") == "colocated"
        and getattr(cfg, "rollout_engine", "torch") == "vllm"
        and cuda
    )


def check_engine_available(cfg: Any) -> None:
    """Fail before any work when the configured engine cannot be imported."""
    if getattr(cfg, "rollout_engine", "torch") == "vllm":
        from gspo.rollout.vllm_engine import require_vllm

        require_vllm()


def build_engine(cfg: Any, model: Any, tokenizer: Any, *, pad_id: int, eos_id: int, **torch_kw):
    """The configured rollout engine for ``model``: ``TorchEngine(model, **torch_kw)`` or a
    ``VLLMEngine`` started from the model's current weights (top-p < 1 allowed only outside
    training, where log-probs are not used)."""
    if getattr(cfg, "rollout_engine", "torch") == "vllm":
        from gspo.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model,
            pad_id=pad_id,
            eos_id=eos_id,
            options=vllm_options(cfg),
            tokenizer=tokenizer,
            seed=cfg.seed,
            logprobs=hasattr(cfg, "old_logprobs"),
        )
    from gspo.rollout.torch_engine import TorchEngine

    return TorchEngine(model, pad_id=pad_id, eos_id=eos_id, tokenizer=tokenizer, **torch_kw)


def close_engine(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()
