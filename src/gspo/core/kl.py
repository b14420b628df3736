"""KL estimators for a penalty β·KL(π_θ || π_ref), per token, on samples drawn from π_θ.

With l = log π_θ(y_t) and r = log π_ref(y_t) of a sampled token (Schulman 2020, "Approximating
KL divergence", http://joschu.net/blog/kl-approx.html):

* ``k1`` = l - r. Unbiased for KL, high variance, can be negative. As a loss term its
  per-token gradient is ∇l, whose expectation under π_θ is 0: in the loss it does not pull
  towards π_ref at all (only its value is useful, e.g. in the reward).
* ``k2`` = ½ (l - r)². Biased for KL (close for small differences), non-negative. Its gradient
  (l - r) ∇l is, in expectation, exactly the gradient of KL(π_θ || π_ref).
* ``k3`` = e^(r-l) - (r-l) - 1. Unbiased for KL, non-negative, low variance: GRPO's estimator.
  Its gradient (1 - e^(r-l)) ∇l is *not* the gradient of KL(π_θ || π_ref) (in expectation it
  is the gradient of the forward KL(π_ref || π_θ)).
* ``k3+`` = k3's value with k2's gradient (straight-through: k2 - sg(k2) + sg(k3)), as verl's
  ``kl_penalty="k3+"``: an unbiased value to log, and the right gradient.

Placement (``TrainConfig.kl_in_reward``): in the loss (GRPO's choice; the estimate of the current
policy, differentiated) or in the reward (PPO/RLHF's choice; the value of the sampling policy,
r_i - β Σ_t k_t, before group normalization, never differentiated).
"""

from __future__ import annotations

import torch

from gspo.config.names import KL_ESTIMATORS

CLAMP = 20.0
"""Log-ratios are clamped to ±CLAMP before exp (as ``gspo.core.objectives.LOG_RATIO_CLAMP``)."""


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token estimate [B, T] of KL(π_θ || π_ref), 0 off the mask (padding may hold inf/NaN).

    ``logprobs`` may carry a gradient; ``ref_logprobs`` is treated as a constant.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    mask = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    diff = torch.where(mask, logprobs - ref_logprobs.detach(), zero)  # [B, T]: l - r
    if estimator == "k1":
        return diff * mask  # [B, T]
    k2 = 0.5 * diff.square()  # [B, T]
    if estimator == "k2":
        return k2 * mask
    d = (-diff).clamp(-CLAMP, CLAMP)  # [B, T]: r - l
    k3 = torch.exp(d) - d - 1.0  # [B, T]
    if estimator == "k3":
        return k3 * mask
    return (k2 - k2.detach() + k3.detach()) * mask  # [B, T]: value k3, gradient k2's


def sequence_kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """[B] Σ_t k_t of each sequence, detached: what ``kl_in_reward`` subtracts (times β) from
    the reward before group normalization (verl's in-reward KL summed over the response, as its
    outcome-advantage estimators sum token rewards)."""
    with torch.no_grad():
        return kl_estimate(logprobs, ref_logprobs, mask, estimator).sum(dim=1)  # [B]
