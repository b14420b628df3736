"""Tiny randomly initialised causal LMs (dense Qwen3, or Qwen3/Qwen2 MoE) for tests and demos,
built from a config in memory: nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from .char_tokenizer import BOS_ID, EOS_ID, PAD_ID


def build_tiny_model(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    seed: int = 0,
    pad_token_id: int = PAD_ID,
    bos_token_id: int = BOS_ID,
    eos_token_id: int = EOS_ID,
    attn_implementation: str = "sdpa",
    num_experts: int = 0,
    top_k: int = 2,
    moe_intermediate_size: int | None = None,
    shared_expert: bool = False,
    norm_topk_prob: bool = True,
) -> PreTrainedModel:
    """A small randomly initialised causal LM with tied embeddings, float32 on CPU: a dense
    Qwen3 (``num_experts=0``) or, with ``num_experts > 0``, an MoE model whose every layer routes
    each token to ``top_k`` experts (see :func:`gspo.models.moe.build_tiny_moe_model`).

    Weights depend only on the arguments (``seed`` included); the global RNG is left untouched.
    ``intermediate_size`` defaults to 8/3 x hidden rounded to a multiple of 8 (SwiGLU sizing).

    Attention defaults to "sdpa": engine (KV-cached) and ``token_logprobs`` (one full pass)
    log-probs then agree to float rounding (exactly, in float64, in our tests). "eager" is not
    usable in float64 with left padding: its additive mask turns the padded query positions NaN,
    which then poisons the real tokens of those rows.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} not divisible by num_heads {num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} not divisible by num_kv_heads {num_kv_heads}")
    if intermediate_size is None:  # (MoE models: the dense-MLP width, unused)
        intermediate_size = swiglu_width(hidden_size)
    common: dict = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        attn_implementation=attn_implementation,
    )
    head_dim = hidden_size // num_heads
    if num_experts == 0:
        config, cls = Qwen3Config(**common, head_dim=head_dim), Qwen3ForCausalLM
    else:
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"need 1 <= top_k <= num_experts, got top_k={top_k}, {num_experts}")
        moe_width = moe_intermediate_size or hidden_size
        common.update(
            moe_intermediate_size=moe_width,
            num_experts=num_experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            # The aux loss is added by the trainer (router_aux_loss_coef), not by the HF model.
            router_aux_loss_coef=0.0,
            output_router_logits=False,
        )
        # Each MoE class loads its transformers modeling module: only for tiny MoE models.
        if shared_expert:
            from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

            config = Qwen2MoeConfig(**common, shared_expert_intermediate_size=moe_width)
            cls = Qwen2MoeForCausalLM
        else:
            from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

            config, cls = Qwen3MoeConfig(**common, head_dim=head_dim), Qwen3MoeForCausalLM
    return seeded_model(cls, config, seed)


def swiglu_width(hidden_size: int) -> int:
    """The MLP width of the tiny models: 8/3 x hidden rounded to a multiple of 8 (SwiGLU)."""
    return max(8, round(8 * hidden_size / 3 / 8) * 8)


def tiny_text_config(
    vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, **own
) -> dict:
    """The text model's config of the tiny image-text models (``tiny-vl``, ``tiny-qwen-vl``):
    the char tokenizer's ids, tied embeddings, 512 positions; ``own``: the model's own keys."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=swiglu_width(hidden_size),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=True,
        **own,
    )


def seeded_model(cls: Any, config: Any, seed: int) -> Any:
    """``cls(config)`` in eval mode, its random init drawn from ``seed``. fork_rng restores the
    CPU RNG state on exit, so building a model has no side effect on whatever sampling or
    shuffling the caller seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.eval()
    return model
