"""``token_logprobs``, the one forward pass the trainer uses to score completions, and the forward
helpers the torch engine shares with it (position ids of left-padded rows, the forward's keywords,
what kind of model it runs).

:func:`model_kind` probes a model once (MoE routers, a vision-language type, the token ids it
never samples) and remembers the answer for that model object, so that every later forward of a
dense text model branches on it and runs no MoE or vision code at all.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fast_forward import completion_logits, supports
from .moe_routing import is_moe
from .vision import block_tokens, blocked_token_ids, check_pixels, is_vision_model


@dataclass(frozen=True)
class ModelKind:
    """What a forward must know of its model beyond its weights."""

    moe: bool
    """It routes tokens to experts: routing to replay and record, a load-balancing loss, and
    rows that are not independent (the routing records span the whole forward)."""
    vision: bool
    """A vision-language model: image tokens need pixel inputs."""
    blocked: tuple[int, ...]
    """Token ids the policy never samples (a VL model's image token): probability 0."""


_KINDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_kind(model: torch.nn.Module) -> ModelKind:
    """``model``'s :class:`ModelKind`, probed once (by ``build_policy``, else on the model's first
    forward) and remembered for the model object (its routers, type and image token are fixed
    once it is built)."""
    try:
        kind = _KINDS.get(model)
    except TypeError:  # a stand-in that cannot be weakly referenced: probed every time
        return ModelKind(is_moe(model), is_vision_model(model), blocked_token_ids(model))
    if kind is None:
        kind = ModelKind(is_moe(model), is_vision_model(model), blocked_token_ids(model))
        _KINDS[model] = kind
    return kind


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

    kind = model_kind(model)
    if kind.vision:
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
    return completion_scores(
        logits, completion_ids, completion_mask, temperature, with_entropy, kind.blocked
    )


def completion_scores(
    logits: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    blocked: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_logprobs`'s result from the completion's logits [N, L, V]: log-probs of
    ``completion_ids`` [N, L] and (when ``with_entropy``) the detached entropy, 0 where
    ``completion_mask`` is 0 or the token is ``blocked``."""
    if blocked:
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
