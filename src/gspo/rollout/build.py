"""Turn a config's engine options into its rollout engine (the torch engine, or vLLM imported
lazily).

The engine's options are plain data (``gspo.config.options.EngineOptions``, cut from the flat
``EngineFields``) and check themselves (``EngineOptions.problems``).
"""

from __future__ import annotations

from typing import Any

from gspo.config.combinations import Options
from gspo.config.options import EngineOptions


def vllm_options(engine: EngineOptions, *, sleep_mode: bool = False):
    """The :class:`gspo.rollout.vllm_engine.VLLMOptions` of the engine options."""
    from gspo.rollout.vllm_engine import VLLMOptions

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


def colocated_sleep(cfg: Options) -> bool:
    """Whether the vLLM engine sleeps while the trainer updates: only on the Ray backend with
    colocated placement (training and rollout share the GPUs), the vLLM engine and CUDA. vLLM
    has no sleep on CPU (a warning) and the torch engine holds no separate memory."""
    import torch

    device = cfg.run.device
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return (
        cfg.backend.backend == "ray"
        and cfg.backend.placement == "colocated"
        and cfg.engine.rollout_engine == "vllm"
        and cuda
    )


def check_engine_available(engine: EngineOptions) -> None:
    """Fail before any work when the configured engine cannot be imported."""
    if engine.rollout_engine == "vllm":
        from gspo.rollout.vllm_engine import require_vllm

        require_vllm()


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
    if engine.rollout_engine == "vllm":
        from gspo.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model,
            pad_id=pad_id,
            eos_id=eos_id,
            options=vllm_options(engine, sleep_mode=sleep_mode),
            tokenizer=tokenizer,
            seed=seed,
            logprobs=logprobs,
        )
    from gspo.rollout.torch_engine import TorchEngine

    return TorchEngine(model, pad_id=pad_id, eos_id=eos_id, tokenizer=tokenizer, **torch_kw)


def train_engine(cfg: Options, model: Any, tokenizer: Any, **torch_kw):
    """A training run's engine (log-probs on; vLLM sleeps through updates when colocated)."""
    return build_engine(
        cfg.engine,
        model,
        tokenizer,
        seed=cfg.run.seed,
        logprobs=True,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        sleep_mode=colocated_sleep(cfg),
        **torch_kw,
    )


def close_engine(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()
