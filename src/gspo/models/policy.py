"""Build the policy a config names: device, threads, the model and tokenizer, its prompt format.

Used by the composition root (``gspo.compose.parts``, ``gspo.compose.train``) and by workers that build their
own copy of the policy (FSDP2 ranks, rollout workers).
"""

from __future__ import annotations

import torch

from gspo.config.fields import DTYPES as CONFIG_DTYPES
from gspo.config.names import declared
from gspo.config.options import ModelOptions

from .char_tokenizer import build_char_tokenizer
from .chat import prompt_format
from .logprobs import model_kind
from .lora import apply_lora
from .model_io import load_model, load_tokenizer
from .moe import fit_experts_kernel
from .pretrained import resolve_model_path
from .tiny_model import build_tiny_model
from .vision import build_tiny_vl, is_vision_model, processor_for
from .vision_qwen import build_tiny_qwen_vl

DTYPES = declared(
    CONFIG_DTYPES,
    {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "float64": torch.float64,
    },
    "dtypes",
)
"""torch dtypes by the names ``gspo.config.fields.DTYPES`` declares (torch-free)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but torch sees no CUDA device")
    return torch.device(name)


def set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def build_policy(cfg: ModelOptions, device: torch.device, *, seed: int):
    """(model, tokenizer): a random-init tiny dense or MoE model (initialized from ``seed``,
    which also seeds LoRA's adapters), or a local Hugging Face checkpoint."""
    if cfg.model in ("tiny-vl", "tiny-qwen-vl"):
        build = build_tiny_vl if cfg.model == "tiny-vl" else build_tiny_qwen_vl
        model, tokenizer = build(
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            seed=seed,
        )
    elif cfg.model in ("tiny", "tiny-moe"):
        tokenizer = build_char_tokenizer()
        experts = {}
        if cfg.model == "tiny-moe":
            experts = dict(
                num_experts=cfg.num_experts,
                top_k=cfg.experts_top_k,
                moe_intermediate_size=cfg.moe_intermediate_size,
                shared_expert=cfg.shared_expert,
            )
        model = build_tiny_model(
            len(tokenizer),
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            seed=seed,
            **experts,
        )
    else:
        # A named model (e.g. smollm2-135m-instruct, materialized once into the cache) or a
        # local Hugging Face checkpoint directory.

        path = resolve_model_path(cfg.model)
        tokenizer = load_tokenizer(path)
        model = load_model(path, dtype=cfg.dtype)
    ensure_pad_token(tokenizer)
    model = model.to(device=device, dtype=DTYPES[cfg.dtype])

    fit_experts_kernel(model)  # MoE: grouped_mm has no float64 kernel (no-op for dense models)
    if cfg.lora_rank > 0:
        model = apply_lora(
            model,
            rank=cfg.lora_rank,
            alpha=cfg.lora_alpha,
            dropout=cfg.lora_dropout,
            target_modules=cfg.lora_target_modules,
            seed=seed,
        )
    model_kind(model)  # probed once, as it is built: every forward branches on the kind it keeps
    return model, tokenizer


def ensure_pad_token(tokenizer) -> None:
    """Give a tokenizer without a pad token (Llama-style) its EOS as pad.

    Safe here because padding never reaches a loss unmasked: prompts are left-padded with an
    attention mask and completions carry an explicit completion mask, so a real EOS at the end
    of a completion stays in it (as the stop token) even when pad == eos.
    """
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token


def build_prompt_format(cfg: ModelOptions, tokenizer, model=None):
    """The run's :class:`gspo.models.chat.PromptFormat` from ``cfg.chat_template`` and
    ``cfg.system_prompt`` (tiny char models: raw prompts, EOS as the only stop token). A
    vision-language ``model`` brings its processor (saved with a checkpoint, else derived from
    the model's config), which encodes prompts with images."""
    processor = None
    if model is not None and is_vision_model(model):
        path = None if cfg.model in ("tiny-vl", "tiny-qwen-vl") else resolve_model_path(cfg.model)
        processor = processor_for(model, tokenizer, path)
    return prompt_format(
        tokenizer,
        mode=cfg.chat_template,
        system_prompt=cfg.system_prompt,
        model=model,
        processor=processor,
    )
