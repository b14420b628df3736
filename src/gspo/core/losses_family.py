"""CISPO, SAPO (token and sequence ratio) and GMPO: registered policy losses next to GSPO.

Each is a *term* function of the registry in ``gspo.core.losses`` (same contract: a per-token
objective matrix [B, T], 0 off the mask, plus clip decisions), so aggregation, micro-batching,
KL, correction weights and metrics work as for the first four. Notation: l = log π_θ (current,
differentiable), o = log π_old (the sampler), r = exp(l - o) the token ratio, s_i GSPO's
sequence ratio exp(mean_t (l - o)), A the group-normalized advantage, sg = stop-gradient.
"""

from __future__ import annotations

import torch

from gspo.core.objectives import (
    LOG_RATIO_CLAMP,
    LossTerms,
    masked_log_ratio,
    register_loss,
    sequence_log_ratio,
)


def _token_log_ratio(logprobs, old_logprobs, mask) -> torch.Tensor:
    return masked_log_ratio(logprobs, old_logprobs, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _per_sequence(advantages: torch.Tensor) -> torch.Tensor:
    """[B] from the [B, 1] per-sequence advantages that ``policy_loss`` passes."""
    return advantages.reshape(advantages.shape[0], -1)[:, 0]  # [B]


# --------------------------------------------------------------------------------------------
# CISPO
# --------------------------------------------------------------------------------------------


@register_loss(
    "cispo",
    clip_low=1.0,
    clip_high=4.0,
    aggregations=("token_mean", "seq_mean_token_mean"),
    token_advantages=True,
    token_clip=True,
    clip_meaning="weight",
    formula="sg(clip(r, 1-ε_l, 1+ε_h)) A log π per token, token mean; IS-weight cap 1+ε_h = 5",
    source="MiniMax-M1, arXiv 2506.13585 (Eq. 4); ε_l=1, ε_h=4 as SkyRL/AReaL (TRL cap 5.0)",
)
def cispo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> LossTerms:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4): clip the importance weight, not the update.

    J = (1/Σ_i |y_i|) Σ_i Σ_t sg(clip(r_{i,t}, 1-ε_low, 1+ε_high)) · A_{i,t} · log π_θ(y_{i,t}).

    No gradient flows through the ratio: dJ/dl_{i,t} = clip(r_{i,t}) A_{i,t} / N_tok for *every*
    token, clipped or not (PPO-style clipping would zero it). The clip bounds a detached weight.

    Clip convention (named here once, used everywhere in gspo): ``clip_high`` = ε_high is the
    distance above 1, the weight cap is **1 + ε_high**, as for every other gspo loss and as verl,
    SkyRL and AReaL clip (defaults from SkyRL/AReaL: ε_low = 1.0, ε_high = 4.0, i.e. cap 5 and
    no lower bound). TRL's ``epsilon_high``
    for ``loss_type="cispo"`` is the cap itself (its recipe's 5.0 ≡ our clip_high = 4.0) and
    TRL has no lower bound. ``clip_low`` = 1 means no lower bound (1 - ε_low = 0).

    "Clipped" in the metrics means the weight was truncated (either side); the gradient is kept.
    Paper aggregation: the token mean (DAPO's).
    """
    log_r = _token_log_ratio(logprobs, old_logprobs, mask)  # [B, T]
    r = torch.exp(log_r).detach()  # [B, T]
    weight = r.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T], detached
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs, zero)  # [B, T]: padding NaN stays out of the graph
    return LossTerms(
        objective=weight * advantages * lp * mask,
        clipped_low=(r < 1.0 - clip_low) & mask,
        clipped_high=(r > 1.0 + clip_high) & mask,
        ratio=r,
        ratio_mask=mask,
    )


# --------------------------------------------------------------------------------------------
# SAPO
# --------------------------------------------------------------------------------------------


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's soft gate f(r) = σ(τ (r - 1)) · 4/τ: f(1) = 2/τ and f'(1) = 1 for any τ.

    f'(r) = 4 σ(τ(r-1)) (1 - σ(τ(r-1))), a bell around r = 1 that decays smoothly (instead of
    PPO's hard zero outside the clip band); larger τ decays faster.
    """
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def _taus(advantages: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be positive, got {tau_pos}, {tau_neg}")
    pos = torch.tensor(tau_pos, dtype=advantages.dtype, device=advantages.device)
    neg = torch.tensor(tau_neg, dtype=advantages.dtype, device=advantages.device)
    return torch.where(advantages > 0, pos, neg)  # A <= 0 takes τ_neg, as the paper and peers


def _no_clip(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(mask)  # [B, T] bool


@register_loss(
    "sapo",
    clip_low=0.0,
    clip_high=0.0,
    aggregations=("seq_mean_token_mean", "token_mean"),
    token_advantages=True,
    clip_meaning="unused",
    options={"tau_pos": 1.0, "tau_neg": 1.05},
    formula="σ(τ(r-1))·(4/τ)·A per token, τ = τ+ (A>0) or τ- (A<=0), no clip",
    source="SAPO (Qwen), arXiv 2511.20347; τ+=1.0, τ-=1.05",
)
def sapo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> LossTerms:
    """SAPO, token ratio (Soft Adaptive Policy Optimization, Qwen, arXiv 2511.20347).

    J = (1/G) Σ_i (1/|y_i|) Σ_t f_{i,t}(r_{i,t}) A_{i,t},  f(r) = σ(τ (r - 1)) · 4/τ,
    τ = τ_pos (1.0) where A > 0, τ_neg (1.05) where A <= 0. dJ/dl = 4 σ (1 - σ) · r · A / (G |y_i|):
    on-policy (r = 1) exactly GRPO's gradient; off-policy a smooth decay instead of a hard clip.
    No clip range (clip/fraction is 0 by construction).
    """
    log_r = _token_log_ratio(logprobs, old_logprobs, mask)  # [B, T]
    r = torch.exp(log_r)  # [B, T]
    gate = sapo_gate(r, _taus(advantages, tau_pos, tau_neg))  # [B, T]
    return LossTerms(
        objective=gate * advantages * mask,
        clipped_low=_no_clip(mask),
        clipped_high=_no_clip(mask),
        ratio=r.detach(),
        ratio_mask=mask,
    )


@register_loss(
    "sapo_seq",
    clip_low=0.0,
    clip_high=0.0,
    aggregations=("seq_mean_token_mean",),
    token_advantages=False,
    clip_meaning="unused",
    options={"tau_pos": 1.0, "tau_neg": 1.05},
    formula="(1/G) Σ_i σ(τ(s_i-1))·(4/τ)·A_i, s_i = GSPO's sequence ratio, no clip",
    source="SAPO (Qwen), arXiv 2511.20347, sequence-ratio variant (TRL "
    "importance_sampling_level='sequence'); τ+=1.0, τ-=1.05",
)
def sapo_seq_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> LossTerms:
    """SAPO with GSPO's sequence ratio s_i = exp((1/|y_i|) Σ_t (l - o)), one term per sequence.

    J = (1/G) Σ_i f_i(s_i) A_i, f as in ``sapo``; every token of y_i gets the gradient
    4 σ (1 - σ) · s_i · A_i / (G |y_i|) (a broadcast term under seq_mean_token_mean, as GSPO).
    """
    adv = _per_sequence(advantages)  # [B]
    s = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask))  # [B]
    term = sapo_gate(s, _taus(adv, tau_pos, tau_neg)) * adv  # [B]
    return LossTerms(
        objective=term[:, None] * mask,  # [B, T]
        clipped_low=_no_clip(mask),
        clipped_high=_no_clip(mask),
        ratio=s.detach(),
        ratio_mask=mask.any(dim=1),
    )


# --------------------------------------------------------------------------------------------
# GMPO
# --------------------------------------------------------------------------------------------


@register_loss(
    "gmpo",
    clip_low=0.4,
    clip_high=0.4,
    aggregations=("seq_mean_token_mean",),
    token_advantages=False,
    token_clip=True,
    clip_meaning="log-ratio",
    formula="(1/G) Σ_i A_i exp(mean_t signclip(log r_t)), log r clipped to [-ε_l, ε_h] = ±0.4",
    source="GMPO, Zhao et al. arXiv 2507.20673 (ε = 0.4 in log space)",
)
def gmpo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> LossTerms:
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673): the geometric mean of token
    ratios, each clipped pessimistically in log space, one term per sequence.

    x_{i,t} = log r_{i,t}; A_i > 0: x̃ = min(x, ε_high); A_i < 0: x̃ = max(x, -ε_low)
    (i.e. sgn(A)·x̃ = min(sgn(A)·x, sgn(A)·clip(x, -ε_low, ε_high)));
    ŝ_i = exp((1/|y_i|) Σ_t x̃_{i,t}),  J = (1/G) Σ_i ŝ_i A_i.

    dJ/dl_{i,t} = ŝ_i A_i / (G |y_i|) for tokens whose log-ratio is inside the bound, 0 for the
    clipped ones (counted in clip/*). Unlike GSPO (one clip decision per sequence), a few
    outlier tokens are clipped while the rest of the sequence keeps its gradient. Defaults:
    ε = 0.4 both sides, i.e. r in [e^-0.4, e^0.4] = [0.670, 1.492].
    """
    adv = _per_sequence(advantages)  # [B]
    x = _token_log_ratio(logprobs, old_logprobs, mask)  # [B, T]
    sgn = torch.sign(adv)[:, None]  # [B, 1]
    x_clip = sgn * torch.minimum(sgn * x, sgn * x.clamp(-clip_low, clip_high))  # [B, T]
    lengths = mask.sum(dim=1).clamp(min=1).to(x.dtype)  # [B]
    s = torch.exp((x_clip * mask).sum(dim=1) / lengths)  # [B]
    xd = x.detach()
    return LossTerms(
        objective=(s * adv)[:, None] * mask,  # [B, T]: the same ŝ_i A_i on every token
        clipped_low=(xd < -clip_low) & (sgn < 0) & mask,
        clipped_high=(xd > clip_high) & (sgn > 0) & mask,
        ratio=s.detach(),
        ratio_mask=mask.any(dim=1),
    )
