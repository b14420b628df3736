"""Policy models and tokenizers: a local char-level tokenizer, tiny Qwen3 models, checkpoint I/O,
and ``token_logprobs``, the one forward pass the trainer uses to score completions.

Nothing here touches the network: tiny models are built from a ``Qwen3Config`` and the
tokenizer from the ``tokenizers`` library; checkpoints are loaded with ``local_files_only=True``.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from gspo.core.atomic import replace_dir

from .fast_forward import completion_logits, supports
from .lora import has_lora, merged_copy, save_lora
from .vision import save_processor

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CHARSET = "".join(chr(c) for c in range(32, 127)) + "\n"
"""Characters the char tokenizer knows: printable ASCII 32..126 (space included), then newline."""
UNK_ID = 3 + len(CHARSET)
"""``<unk>``: every other character (tab, accented letters, €, emoji ...), one per code point."""

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, then one token per
    printable ASCII character 32..126 in code-point order, newline (97 + 1), and ``<unk>``
    last (vocab size 100).

    Encoding with ``add_special_tokens=True`` (the default) prepends ``<bos>``; padding is on the
    left. Any other character (a tab, an accented letter, €, an emoji) encodes as one ``<unk>``
    per code point, so user prompts never crash the tokenizer; ``<unk>`` is a special token, so
    decoding with ``skip_special_tokens`` drops it. The trainer counts such prompts
    (``data/prompts_with_unknown_chars``) and ``encode_strict`` still rejects them.
    """
    vocab = {PAD_TOKEN: PAD_ID, BOS_TOKEN: BOS_ID, EOS_TOKEN: EOS_ID}
    for ch in CHARSET:
        vocab[ch] = len(vocab)
    vocab[UNK_TOKEN] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every code point is its own pre-token, spaces and newlines included ("isolated" keeps
    # the matches; "." would not match a newline).
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"[\s\S]"), behavior="isolated")
    # Fuse concatenates the tokens with nothing in between, so spaces round-trip exactly.
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        # No "cleanup" that would drop the space in e.g. "a ." on decode.
        clean_up_tokenization_spaces=False,
    )


def encode_strict(
    tokenizer: PreTrainedTokenizerBase, text: str, *, add_special_tokens: bool = True
) -> list[int]:
    """Encode ``text`` and fail loudly if any part of it is unknown to the tokenizer.

    Raises ``ValueError`` for characters outside the char tokenizer's charset, and for any
    tokenizer that has an unk token, if an unk id shows up in the encoding.
    """
    vocab = tokenizer.get_vocab()
    if all(ch in vocab for ch in CHARSET):
        # The char-level vocab: check characters up front, for a message naming them.
        bad = sorted({ch for ch in text if ch not in vocab})
        if bad:
            raise ValueError(f"characters not in the tokenizer vocabulary: {bad!r} in {text!r}")
    try:
        ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    except Exception as exc:  # tokenizers raises a bare Exception for missing unk
        raise ValueError(f"cannot encode {text!r}: {exc}") from exc
    if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
        raise ValueError(f"text encodes to the unk token: {text!r}")
    return list(ids)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


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
        intermediate_size = max(8, round(8 * hidden_size / 3 / 8) * 8)
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
    # fork_rng restores the CPU RNG state on exit, so building a model has no side effect on
    # whatever sampling or shuffling the caller seeded.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.eval()
    return model


def _check_checkpoint_dir(path: str | Path, needed: tuple[str, ...]) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no checkpoint directory at {str(p)!r}")
    if not p.is_dir():
        raise ValueError(f"{str(p)!r} is a file, expected a checkpoint directory")
    if not any((p / name).exists() for name in needed):
        raise ValueError(f"{str(p)!r} is not a checkpoint directory (none of {list(needed)})")
    return p


def load_model(
    path: str | Path, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Load a causal LM from a local Hugging Face directory (never the hub)."""
    p = _check_checkpoint_dir(path, ("config.json",))
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; one of {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    # A vision-language checkpoint (Idefics3 / SmolVLM / Qwen2.5-VL) is an image-text model,
    # not a causal LM.
    config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    if getattr(config, "model_type", None) in ("idefics3", "smolvlm", "qwen2_5_vl"):
        from transformers import AutoModelForImageTextToText as auto
    else:
        auto = AutoModelForCausalLM
    model = auto.from_pretrained(str(p), dtype=dtype, local_files_only=True)
    return model.to(device)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local Hugging Face directory (never the hub)."""
    p = _check_checkpoint_dir(path, ("tokenizer.json", "tokenizer_config.json"))
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, path: str | Path
) -> None:
    """Save model (safetensors) and tokenizer to ``path`` with ``save_pretrained``.

    A model with LoRA adapters is saved merged (a plain Hugging Face model that
    ``transformers`` loads without peft), with the adapter itself in ``path/adapter``.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed into place: a kill mid-save never leaves a torn
    # model under the real name (an existing one is replaced only once the new one is complete).
    tmp = Path(tempfile.mkdtemp(dir=p.parent, prefix=f".tmp-{p.name}-"))
    try:
        if has_lora(model):
            save_lora(model, tmp / "adapter")
            model = merged_copy(model)
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        save_processor(model, tokenizer, tmp)  # a VL model's image processor goes with it

        replace_dir(tmp, p)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------


def forward_kwargs_support(model: torch.nn.Module) -> set[str]:
    """Names of the keyword arguments ``model.forward`` accepts (to pick version-specific ones
    such as ``logits_to_keep`` or ``cache`` vs ``past_key_values``)."""
    return set(inspect.signature(model.forward).parameters)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded rows: 0 at each row's first real token (pads get 0).

    HF causal LMs number positions 0..T-1 regardless of the mask, which would shift RoPE
    positions of left-padded rows; passing these explicitly makes padding invisible.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [N, T]


def _upcast(x: torch.Tensor) -> torch.Tensor:
    # log_softmax in bf16/fp16 loses several digits; score in at least float32.
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def token_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    prompt_index: torch.Tensor | None = None,
    pixels=None,
    pixel_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of the completion tokens under ``log_softmax(logits / temperature)``.

    One forward pass over ``cat(prompt, completion)`` with explicit position ids, so left
    padding of the prompt does not change the result. Differentiable (call it under grad for
    the policy loss). Temperature 0 (greedy) is scored as temperature 1, matching the engines.

    Returns ``(logprobs, entropy)``, both ``[N, L]`` and zero where ``completion_mask`` is 0;
    ``entropy`` (of the same temperature-scaled distribution, detached) is None unless asked.
    Values are float32 for half-precision models, else the model's dtype.

    ``prompt_index`` [N] (optional) says which rows share a prompt (equal index = the same
    prompt, e.g. ``Rollout.prompt_index``): for models ``gspo.models.fast_forward`` supports, each
    distinct prompt then runs once and its keys/values serve all of its rows (same values and
    gradients up to float rounding, fewer FLOPs); other models ignore it.

    ``pixels`` (a :class:`gspo.models.vision.PixelInputs`, one entry per prompt) are the image
    inputs of a vision-language rollout, the very tensors its generation was conditioned on;
    each row gets its prompt's (``prompt_index`` is then required), or the entry
    ``pixel_index`` [N] names (multi-turn episodes: each row its own episode's images, those of
    environment replies included, :func:`gspo.rollout.base.pixel_rows`). The vision tower runs
    once per distinct entry and its features are shared by the entry's rows
    (:func:`gspo.models.vision.image_inputs`). Image tokens in the completion are environment
    tokens (a policy never samples one): their log-prob is 0.
    """
    n, p = prompt_ids.shape
    length = completion_ids.shape[1]
    if length == 0:
        empty = completion_ids.new_zeros((n, 0), dtype=torch.float32)  # [N, 0]
        return empty, (empty.clone() if with_entropy else None)
    if p == 0:
        raise ValueError("token_logprobs needs at least one prompt token to condition on")

    from .vision import check_pixels

    check_pixels(model, prompt_ids, pixels)
    check_pixels(model, completion_ids, pixels)  # (image tokens of environment replies)
    rows = prompt_index if pixel_index is None else pixel_index
    if pixels is not None and rows is None:
        raise ValueError("token_logprobs with pixel inputs needs the rows' prompt_index")
    if prompt_index is not None and pixels is None and supports(model):
        logits = completion_logits(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, prompt_index
        )  # [N, L, V]
    else:
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [N, P+L]
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()  # [N, P+L]
        position_ids = positions_from_mask(attention_mask)  # [N, P+L]
        kwargs: dict = {"use_cache": False}
        if "logits_to_keep" in forward_kwargs_support(model):
            # Only the last L+1 positions' logits are materialised: P-1 .. P+L-1.
            kwargs["logits_to_keep"] = length + 1
        if pixels is None:
            inputs: dict = {"input_ids": input_ids}
        else:
            # The pixel type knows its model's keywords: Idefics3's merged image features,
            # Qwen2.5-VL's patches and grids with M-RoPE positions [N, P+L] (the engine's).
            dtype = next(model.parameters()).dtype
            pix = pixels.to(prompt_ids.device, dtype)
            inputs, mrope = pix.forward_inputs(model, input_ids, attention_mask, rows)
            position_ids = position_ids if mrope is None else mrope
        logits = model(
            attention_mask=attention_mask, position_ids=position_ids, **inputs, **kwargs
        ).logits  # [N, L+1, V] or [N, P+L, V]
        # Position t predicts token t+1: completion token j is predicted at P-1+j. With
        # logits_to_keep=L+1 that is every kept position but the last.
        logits = logits[:, -(length + 1) : -1]  # [N, L, V]
    from .vision import block_tokens, blocked_token_ids

    blocked = blocked_token_ids(model)
    logits = block_tokens(logits, blocked)  # [N, L, V] (VL: no image token)
    t = 1.0 if temperature == 0 else float(temperature)
    scaled = _upcast(logits) if t == 1.0 else _upcast(logits) / t  # [N, L, V]
    logp_all = F.log_softmax(scaled, dim=-1)  # [N, L, V]
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # [N, L]
    keep = completion_mask.bool()  # [N, L]
    if blocked:  # image tokens of environment replies: context, never sampled (-inf above)
        keep = keep & ~torch.isin(completion_ids, torch.tensor(blocked, device=keep.device))
    logp = logp.masked_fill(~keep, 0.0)  # [N, L]
    entropy = None
    if with_entropy:
        # Detached: no second graph through the [N, L, V] tensor.
        with torch.no_grad():
            la = logp_all.detach()  # [N, L, V]
            probs = la.exp()  # [N, L, V]
            if blocked:  # a VL policy's blocked image token: p = 0, log p = -inf, p log p = 0
                la = la.masked_fill(la.isneginf(), 0.0)  # [N, L, V]
            entropy = (-(probs * la).sum(-1)).masked_fill(~keep, 0.0)  # [N, L]
    return logp, entropy
