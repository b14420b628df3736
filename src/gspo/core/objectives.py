"""GRPO, GSPO, LUSPO and GSPO-token: the registered term functions of ``gspo.core.losses``.

Each turns log-probs, old log-probs and advantages into a per-token objective matrix [B, T] plus
its clip decisions; ``gspo.core.losses.policy_loss`` aggregates it. Registered in this order on
import of ``gspo.core.losses`` (the rest of the family: ``gspo.core.losses_family``).
"""

from __future__ import annotations

import torch

from gspo.core.loss_terms import (
    LOG_RATIO_CLAMP,
    LossTerms,
    builtin_loss,
    clipped_surrogate,
    masked_log_ratio,
    sequence_log_ratio,
)


@builtin_loss("grpo")
def grpo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> LossTerms:
    """GRPO (token-level ratio), DeepSeekMath / GSPO Eq. 2.

    w_{i,t} = exp(l_{i,t} - o_{i,t}),  term_{i,t} = min(w A_{i,t}, clip(w, 1-ε_low, 1+ε_high) A_{i,t}).
    Paper aggregation: seq_mean_token_mean; token_mean is DAPO's, constant is Dr. GRPO's.

    Dual clip (Ye et al. 2020, arXiv 1912.09729; verl ``clip_ratio_c``, default 3 there, off
    here): for A_{i,t} < 0 the term becomes max(term, c · A_{i,t}), so a negative-advantage token
    whose ratio grew past c stops pushing (its gradient is 0; it counts in ``clipped_high``).
    """
    log_w = masked_log_ratio(logprobs, old_logprobs, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    w = torch.exp(log_w)  # [B, T]
    term, low, high = clipped_surrogate(w, advantages, clip_low, clip_high)  # [B, T]
    if dual_clip is not None:
        if not dual_clip > 1.0:
            raise ValueError(f"dual_clip must be > 1 (a cap on the ratio), got {dual_clip}")
        negative = advantages < 0  # [B, T] or [B, 1]
        term = torch.where(negative, torch.maximum(term, dual_clip * advantages), term)  # [B, T]
        high = high | (negative & (w.detach() > dual_clip))
    return LossTerms(
        objective=term * mask,
        clipped_low=low & mask,
        clipped_high=high & mask,
        ratio=w.detach(),
        ratio_mask=mask,
    )


def _gspo_sequence_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> LossTerms:
    """Shared by GSPO and LUSPO: the per-sequence clipped term broadcast to its tokens."""
    s = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask))  # [B]
    term, low, high = clipped_surrogate(s, advantages, clip_low, clip_high)  # [B]
    nonempty = mask.any(dim=1)  # [B]
    return LossTerms(
        objective=term[:, None] * mask,  # [B, T]: the same ℓ_i on every token of y_i
        clipped_low=low[:, None] & mask,
        clipped_high=high[:, None] & mask,
        ratio=s.detach(),
        ratio_mask=nonempty,
    )


@builtin_loss("gspo")
def gspo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> LossTerms:
    """GSPO (GSPO Eqs. 5-7): sequence ratio, whole responses clipped.

    s_i = exp((1/|y_i|) Σ_t (l_{i,t} - o_{i,t})),  J = (1/G) Σ_i min(s_i A_i, clip(s_i) A_i).
    Every token of y_i gets the gradient weight s_i A_i / (G |y_i|), or 0 if y_i is clipped.
    """
    return _gspo_sequence_terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high)


@builtin_loss("luspo")
def luspo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> LossTerms:
    """LUSPO: GSPO's clipped term scaled by the response length, constant 1/G normalizer.

    J = (1/G) Σ_i |y_i| · min(s_i A_i, clip(s_i) A_i). The |y_i| comes from the token-sum
    aggregation of the broadcast term, once; the per-sequence gradient is |y_i| times GSPO's.
    """
    return _gspo_sequence_terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high)


@builtin_loss("gspo_token")
def gspo_token_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> LossTerms:
    """GSPO-token (GSPO Eqs. 13-17): per-token advantages with the sequence ratio's value.

    s_{i,t} = sg[s_i] · exp(l_{i,t} - sg[l_{i,t}]); numerically s_{i,t} = s_i, and
    J = (1/G) Σ_i (1/|y_i|) Σ_t min(s_{i,t} A_{i,t}, clip(s_{i,t}) A_{i,t}).
    With A_{i,t} = A_i its value, clip decisions and gradient equal GSPO's.
    """
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs, zero)  # [B, T]: keeps padding NaN out of the graph
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask).detach()  # [B]
    log_s_t = log_s[:, None] + lp - lp.detach()  # [B, T]: value log s_i, gradient d l_{i,t}
    s_t = torch.exp(log_s_t)  # [B, T]
    term, low, high = clipped_surrogate(s_t, advantages, clip_low, clip_high)  # [B, T]
    return LossTerms(
        objective=term * mask,
        clipped_low=low & mask,
        clipped_high=high & mask,
        ratio=torch.exp(log_s),
        ratio_mask=mask.any(dim=1),
    )
