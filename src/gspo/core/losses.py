"""Policy losses: GRPO, GSPO, GSPO-token and LUSPO, as pure functions of tensors.

(The term functions live in ``gspo.core.objectives`` (GRPO, GSPO, LUSPO, GSPO-token) and
``gspo.core.losses_family`` (CISPO, SAPO, GMPO) and register in ``gspo.core.objectives``, which
also holds their shared building blocks; importing this module loads them, so ``LOSSES`` and
``get_loss`` read from here are complete. KL estimators live in ``gspo.core.kl``.)

Every loss has two separate parts, so that neither silently changes the other:

1. a *term* function (registered in ``LOSSES``) that turns log-probs, old log-probs and advantages
   into a per-token objective matrix ``[B, T]`` plus its clip decisions, and
2. an *aggregation* (``aggregate``) that reduces that matrix to a scalar with an explicit,
   named denominator.

Sequence-level algorithms (GSPO, LUSPO) broadcast their per-sequence term to the tokens of the
sequence; the aggregation then decides how length enters:

* GSPO uses ``seq_mean_token_mean``: the token mean of a broadcast term is the term itself, so
  J = (1/G) Σ_i ℓ_i exactly (GSPO Eq. 5).
* LUSPO uses ``seq_mean_token_sum``: the token sum of a broadcast term is |y_i| ℓ_i, so
  J = (1/G) Σ_i |y_i| ℓ_i (LUSPO), with the length entering exactly once.

Pairing GSPO with a batch ``token_mean`` (as several peers do) would give LUSPO up to a per-batch
constant, not GSPO; each loss therefore declares the aggregations it accepts.

Denominators are passed in (``num_sequences``, ``num_tokens``) so that the sum of the losses of
k micro-batches, each given the global counts, has the same gradient as the whole batch at once.

The loss returned is the negated objective, -J: minimizing it maximizes J.

The advantages it weighs are group-normalized (:func:`group_advantages`): each response is
scored against the other responses to its prompt.
"""

from __future__ import annotations

import torch

# The built-in term functions register on import, in this order (the registry's order): GRPO,
# GSPO, LUSPO and GSPO-token, then the rest of the family.
# isort: off
from gspo.core import objectives as _objectives  # noqa: F401
from gspo.core import losses_family as _losses_family  # noqa: F401

# isort: on
from gspo.config.names import ADVANTAGE_SCALES as SCALES
from gspo.config.names import LOSS_MODULES, builtin_losses, declared
from gspo.core.kl import KL_ESTIMATORS, kl_estimate
from gspo.core.objectives import (
    AGGREGATIONS,
    LOG_RATIO_CLAMP,
    LOSSES,
    LossSpec,
    LossTerms,
    masked_log_ratio,
)

# The losses the built-in modules registered are the ones gspo.config.names reads from their
# decorators' source (one registered another way there fails here); a plugin's are not built-in.
_builtin = {n: s for n, s in LOSSES.items() if s.terms.__module__ in LOSS_MODULES}
declared(builtin_losses(), _builtin, "policy losses")


def get_loss(name: str) -> LossSpec:
    """Look up a registered loss; unknown names raise ValueError listing the valid ones."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy loss {name!r}; valid: {', '.join(sorted(LOSSES))}"
        ) from None


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token matrix [B, T] (already 0 off the mask) to a scalar.

    * ``seq_mean_token_mean``: (1/N_seq) Σ_i (1/|y_i|) Σ_t x_{i,t}   (GRPO paper, GSPO)
    * ``token_mean``:          (1/N_tok) Σ_i Σ_t x_{i,t}             (DAPO)
    * ``seq_mean_token_sum``:  (1/N_seq) Σ_i Σ_t x_{i,t}             (LUSPO)
    * ``constant``:            (1/(N_seq · C)) Σ_i Σ_t x_{i,t}       (Dr. GRPO, C e.g. L_max)

    N_seq defaults to this batch's non-empty rows and N_tok to its response tokens; pass the
    global counts when the batch is one micro-batch of a larger one. Empty rows contribute 0.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")
    lengths = mask.sum(dim=1)  # [B]
    n_seq = float(num_sequences) if num_sequences is not None else max(int((lengths > 0).sum()), 1)
    n_tok = float(num_tokens) if num_tokens is not None else max(int(lengths.sum()), 1)
    if n_seq <= 0 or n_tok <= 0:
        raise ValueError(
            f"denominators must be positive, got num_sequences={n_seq}, num_tokens={n_tok}"
        )
    if mode == "seq_mean_token_mean":
        per_seq = per_token.sum(dim=1) / lengths.clamp(min=1).to(per_token.dtype)  # [B]
        return per_seq.sum() / n_seq
    if mode == "token_mean":
        return per_token.sum() / n_tok
    if mode == "seq_mean_token_sum":
        return per_token.sum() / n_seq
    if constant is None or constant <= 0:
        raise ValueError(
            "aggregation 'constant' needs a positive `constant` (e.g. max response length)"
        )
    return per_token.sum() / (n_seq * float(constant))


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def _validate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: LossSpec,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check shapes (a [B, 1] tensor must never broadcast to [B, B]) and normalize mask/advantages."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    shape = tuple(logprobs.shape)
    for label, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{label} must have the shape of logprobs {shape}, got {tuple(t.shape)}"
            )
    if not logprobs.is_floating_point():
        raise ValueError(f"logprobs must be floating point, got {logprobs.dtype}")
    if mask.dtype != torch.bool:
        if ((mask != 0) & (mask != 1)).any():
            raise ValueError("mask must hold only 0 and 1")
        mask = mask.bool()
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        advantages = advantages[:, None]  # [B, 1]: one advantage per sequence
    elif tuple(advantages.shape) == shape:
        if not spec.token_advantages:
            raise ValueError(
                f"loss {spec.name!r} takes one advantage per sequence ([B]); per-token advantages "
                "[B, T] need a token-level loss such as 'gspo_token' or 'grpo'"
            )
    else:
        raise ValueError(
            f"advantages must be [B]={shape[0]} or [B, T]={shape}, got {tuple(advantages.shape)}"
        )
    if spec.sequence_advantages:
        advantages = advantages[:, 0]  # [B]: sequence-level terms work on per-sequence values
    return mask, advantages.to(logprobs.dtype)


def policy_loss(
    name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float | None = None,
    aggregation: str | None = None,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    constant: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    weights: torch.Tensor | None = None,
    options: dict[str, float | None] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Compute a registered policy loss, -J, and its metrics.

    Args:
        name: a key of ``LOSSES`` ("grpo", "gspo", "gspo_token", "luspo", ...).
        logprobs: [B, T] log-probs of the sampled tokens under the current policy (differentiable).
        old_logprobs: [B, T] the same under the policy that sampled them (no gradient needed).
        advantages: [B] per sequence, or [B, T] per token (token-level losses only).
        mask: [B, T] 1 for response tokens, 0 for prompt and padding.
        clip_low, clip_high: ε below and above 1; None takes the loss's paper default.
        aggregation: None takes the loss's paper default; others must be listed by the loss.
        num_sequences, num_tokens: global denominators for micro-batching (see ``aggregate``).
        constant: the normalizer C of the ``constant`` aggregation (Dr. GRPO's L_max).
        ref_logprobs: [B, T] reference-policy log-probs for an optional KL penalty.
        kl_coef: β of the KL penalty β·KL(π_θ || π_ref) (per token, aggregated with the same
            aggregation as the policy term, so LUSPO weighs it by length once).
        kl_estimator: k1, k2, k3 (default) or k3+ (see ``gspo.core.kl``).
        weights: detached behaviour-correction weights, [B] or [B, T] (e.g. truncated importance
            sampling against the rollout engine, or the 0/1 off-policy sequence mask of
            ``gspo.core.offpolicy``), multiplying the per-token policy term.
        options: the loss's extra options (``LossSpec.options``, e.g. GRPO's ``dual_clip``,
            SAPO's ``tau_pos``/``tau_neg``); missing ones take the registered defaults.

    Returns:
        (loss, metrics): loss is a scalar tensor; metrics holds Python floats, including
        ``clip/fraction`` (share of response tokens whose gradient is zeroed by clipping),
        ``clip/seq_fraction`` (share of sequences with any clipped token), ``clip/low_fraction``,
        ``clip/high_fraction``, ``ratio/mean|min|max`` (sequence ratios for the GSPO family,
        token ratios for GRPO), and ``kl/old_new`` (k3 estimate of KL(π_old || π_θ) per token).
    """
    spec = get_loss(name)
    aggregation = spec.default_aggregation if aggregation is None else aggregation
    if aggregation not in spec.aggregations:
        raise ValueError(
            f"loss {name!r} does not support aggregation {aggregation!r}; "
            f"valid: {', '.join(spec.aggregations)}"
        )
    if spec.clip_meaning == "unused" and (clip_low is not None or clip_high is not None):
        raise ValueError(f"loss {name!r} has no clip range; clip_low/clip_high must be None")
    clip_low = spec.clip_low if clip_low is None else float(clip_low)
    clip_high = spec.clip_high if clip_high is None else float(clip_high)
    # clip_low = 1 removes the lower bound of a ratio (1 - ε_low = 0): CISPO's default.
    if not (0.0 <= clip_low <= 1.0 or spec.clip_meaning == "log-ratio") or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low <= 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if clip_low < 0.0:
        raise ValueError(f"clip_low must be >= 0, got {clip_low}")
    known = dict(spec.options)
    unknown = sorted(set(options or {}) - set(known))
    if unknown:
        raise ValueError(
            f"loss {name!r} has no option {', '.join(unknown)}; valid: {', '.join(known) or 'none'}"
        )
    known.update({k: v for k, v in (options or {}).items() if v is not None})
    mask, advantages = _validate(logprobs, old_logprobs, advantages, mask, spec)
    old_logprobs = old_logprobs.detach()

    terms = spec.terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **known)
    objective = terms.objective  # [B, T]
    if weights is not None:
        w = weights.detach().to(objective.dtype)
        w = w[:, None] if w.dim() == 1 else w  # [B, 1] or [B, T]
        if w.shape[0] != objective.shape[0] or w.shape[1] not in (1, objective.shape[1]):
            raise ValueError(f"weights must be [B] or [B, T], got {tuple(weights.shape)}")
        objective = objective * w
    denominators = {"num_sequences": num_sequences, "num_tokens": num_tokens, "constant": constant}
    loss = -aggregate(objective, mask, aggregation, **denominators)

    kl_ref = None
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"unknown kl_estimator {kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}"
        )
    if kl_coef != 0.0:
        if ref_logprobs is None or tuple(ref_logprobs.shape) != tuple(logprobs.shape):
            raise ValueError("kl_coef != 0 needs ref_logprobs of the shape of logprobs")
        kl_ref = kl_estimate(logprobs, ref_logprobs.detach(), mask, kl_estimator)  # [B, T]
        loss = loss + kl_coef * aggregate(kl_ref, mask, aggregation, **denominators)

    metrics = _metrics(terms, logprobs, old_logprobs, mask)
    if kl_ref is not None:
        metrics["kl/ref"] = float(kl_ref.detach().sum()) / max(int(mask.sum()), 1)
    return loss, metrics


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ || π_ref) on samples of π_θ: e^(r-l) - (r-l) - 1, r=ref.

    Non-negative, unbiased, lower variance than log-ratio; 0 off the mask. See ``gspo.core.kl``.
    """
    return kl_estimate(logprobs, ref_logprobs, mask, "k3")  # [B, T]


def _metrics(
    terms: LossTerms, logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Clip shares and ratio statistics as Python floats (counts divided in double precision)."""
    with torch.no_grad():
        n_tok = max(int(mask.sum()), 1)
        nonempty = mask.any(dim=1)  # [B]
        n_seq = max(int(nonempty.sum()), 1)
        clipped = terms.clipped_low | terms.clipped_high  # [B, T]
        ratios = terms.ratio[terms.ratio_mask]
        # k3 estimate of KL(π_old || π_θ) with samples from π_old: e^(l-o) - (l-o) - 1.
        d = masked_log_ratio(logprobs, old_logprobs, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = (torch.exp(d) - d - 1.0) * mask
        has = ratios.numel() > 0
        return {
            "clip/fraction": int(clipped.sum()) / n_tok,
            "clip/low_fraction": int(terms.clipped_low.sum()) / n_tok,
            "clip/high_fraction": int(terms.clipped_high.sum()) / n_tok,
            "clip/seq_fraction": int((clipped.any(dim=1) & nonempty).sum()) / n_seq,
            "ratio/mean": float(ratios.mean()) if has else 1.0,
            "ratio/min": float(ratios.min()) if has else 1.0,
            "ratio/max": float(ratios.max()) if has else 1.0,
            "ratio/count": float(ratios.numel()),  # what ratio/mean averages over, for pooling
            "kl/old_new": float(kl.sum()) / n_tok,
        }


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale: str = "std", eps: float = 1e-6
) -> torch.Tensor:
    """A_i = (r_i - mean_g(r)) / (std_g(r) + eps) within each group of ``group_size`` responses.

    ``rewards`` is [B] laid out group after group (B = n_groups * group_size). ``scale``:

    * ``"std"`` (default): the *population* standard deviation (divide by G), so rewards
      [1, 0, 0, 1] give exactly ±1 up to eps;
    * ``"sample_std"``: the Bessel-corrected sample std (divide by G - 1, as ``torch.std`` and
      TRL do): [1, 0, 0, 1] gives ±0.866;
    * ``"none"``: Dr. GRPO's r - mean, no division.

    A group whose rewards are all equal gets exactly 0 (never NaN), whatever the scale: the
    centred rewards are exactly 0 there. A group of size 1 also gets 0 (no baseline to compare
    with). Advantages sum to 0 within each group up to rounding.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(SCALES)}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(f"{rewards.shape[0]} rewards cannot be split into groups of {group_size}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards must be finite (got inf or NaN)")
    groups = rewards.view(-1, group_size)  # [n_groups, G]
    centred = groups - groups.mean(dim=1, keepdim=True)  # [n_groups, G]
    # Equal rewards can leave a rounding residue after mean subtraction; make those groups exact 0.
    equal = (groups == groups[:, :1]).all(dim=1, keepdim=True)  # [n_groups, 1]
    centred = torch.where(equal, torch.zeros_like(centred), centred)
    if scale == "none" or group_size == 1:
        return centred.reshape(-1)  # [B]
    std = groups.std(dim=1, keepdim=True, correction=1 if scale == "sample_std" else 0)
    # Equal groups divide 0 by 1, not by a rounding-noise std (0/0 = NaN when eps is 0).
    std = torch.where(equal, torch.ones_like(std), std)  # [n_groups, 1]
    return (centred / (std + eps)).reshape(-1)  # [B]


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence advantages [B] copied onto each response token: [B, T], 0 off the mask."""
    return advantages[:, None] * mask.to(advantages.dtype)  # [B, T]
