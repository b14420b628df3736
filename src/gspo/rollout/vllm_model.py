"""What the vLLM engine (:mod:`gspo.rollout.vllm_engine`) needs of the trainer's model: whether
vLLM can serve it (``check_loadable``, before starting anything), the weights to send
(``trainer_state_dict``, LoRA merged), and the reload that runs inside the vLLM worker
(``reload_in_worker``, with the tied-head refresh of the CPU backend)."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import torch
from safetensors.torch import load

from gspo.config.names import VLLM_CPU_HEAD_SIZES
from gspo.models.lora import has_lora, merged_copy
from gspo.models.moe import is_moe

CPU_HEAD_SIZES = VLLM_CPU_HEAD_SIZES
"""Attention head sizes vLLM's CPU attention backend supports (vllm-cpu 0.32; declared in
gspo.config.names, whose config check refuses tiny-vl's before a run starts)."""


def _model_config(model: torch.nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("the vLLM engine needs a Hugging Face model (with a .config)")
    return config


def text_config(config: Any) -> Any:
    """The text model's config: the config itself for a text model, ``text_config`` for a
    vision-language one (its attention sizes, vocabulary and positions live there)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def check_loadable(model: torch.nn.Module, on_cpu: bool) -> None:
    """Raise ValueError naming the reason when vLLM cannot serve ``model`` (before starting it)."""
    config = _model_config(model)
    archs = list(getattr(config, "architectures", None) or [type(model).__name__])
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    if not any(a in supported for a in archs):
        raise ValueError(
            f"vLLM cannot load this model: architecture {archs} is not in vLLM's model registry; "
            "use rollout_engine='torch'"
        )
    if on_cpu:
        if is_moe(model):
            # Measured with vllm-cpu 0.32: reload_weights on a Qwen3-MoE model, even with
            # unchanged weights, leaves the CPU fused-experts kernel with wrong weights
            # (engine vs trainer log-probs then differ by ~0.05), so no weight sync is possible.
            raise ValueError(
                "vLLM on CPU cannot take new weights into an MoE model: vllm-cpu 0.32's in-place "
                "reload corrupts the packed expert weights (measured log-prob mismatch ~0.05 "
                "after a reload of unchanged weights); use rollout_engine='torch' for MoE models "
                "on CPU (vLLM on GPU uses other MoE kernels; not verified here)"
            )
        text = text_config(config)
        heads = getattr(text, "num_attention_heads", None)
        head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
        if head_dim is not None and head_dim not in CPU_HEAD_SIZES:
            raise ValueError(
                f"vLLM's CPU attention cannot run this model: head size {head_dim} (hidden_size / "
                f"num_heads) is not one of {list(CPU_HEAD_SIZES)}; e.g. for the tiny model pick "
                "hidden_size and num_heads with hidden_size / num_heads >= 32, or use "
                "rollout_engine='torch'"
            )


def trainer_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights the engine should serve: LoRA folded into the base weights (plain Hugging
    Face names), detached, on CPU."""
    if has_lora(model):
        model = merged_copy(model)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _tied(model: torch.nn.Module) -> bool:
    return bool(getattr(text_config(_model_config(model)), "tie_word_embeddings", False))


def reload_in_worker(worker: Any, weights: Any, tied: bool, refresh_head: bool = True) -> None:
    """Runs inside the vLLM worker (``collective_rpc``): load ``weights`` in place, either a list
    of (name, tensor) (in-process mode) or safetensors bytes (multi-process mode), then rebuild
    a tied output head's packed weight from the new embedding."""
    if isinstance(weights, (bytes, bytearray)):
        weights = list(load(bytes(weights)).items())
    worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    if tied and refresh_head:
        net = worker.model_runner.get_model()
        head = getattr(net, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


@contextlib.contextmanager
def process_state_kept():
    """Undo what vLLM's in-process CPU worker does to the whole process while it starts: it
    seeds the global RNGs (torch, numpy, random) with its own seed and replaces
    ``torch.set_num_threads`` with a no-op, which would change the trainer's sampling streams
    and thread settings."""
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    states = (torch.random.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        torch.random.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
