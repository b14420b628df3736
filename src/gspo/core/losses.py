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

from collections.abc import Callable

import torch

# The built-in term functions register on import, in this order (the registry's order): GRPO,
# GSPO, LUSPO and GSPO-token, then the rest of the family.
# isort: off
from gspo.core import objectives as _objectives  # noqa: F401
from gspo.core import losses_family as _losses_family  # noqa: F401

# isort: on
from gspo.config.names import ADVANTAGE_SCALES as SCALES
from gspo.config.names import LOSS_MODULES, builtin_losses, declared
from gspo.core import loss_metrics
from gspo.core.kl import KL_ESTIMATORS, kl_estimate
from gspo.core.objectives import (
    AGGREGATIONS,
    LOSSES,
    LossSpec,
    TermFn,
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
    denominator = _denominator(mask, mode, num_sequences, num_tokens, constant)
    return _reduce(per_token, mask, mode, denominator)


def _denominator(
    mask: torch.Tensor,
    mode: str,
    num_sequences: float | None,
    num_tokens: float | None,
    constant: float | None,
) -> float:
    """What :func:`aggregate` divides the masked sum by in ``mode`` (its checks included)."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")
    # The update passes both counts: the mask is summed only for a default.
    lengths = None if None not in (num_sequences, num_tokens) else mask.sum(dim=1)  # [B]
    n_seq = float(num_sequences) if num_sequences is not None else max(int((lengths > 0).sum()), 1)
    n_tok = float(num_tokens) if num_tokens is not None else max(int(lengths.sum()), 1)
    if n_seq <= 0 or n_tok <= 0:
        raise ValueError(
            f"denominators must be positive, got num_sequences={n_seq}, num_tokens={n_tok}"
        )
    if mode == "token_mean":
        return n_tok
    if mode != "constant":
        return n_seq
    if constant is None or constant <= 0:
        raise ValueError(
            "aggregation 'constant' needs a positive `constant` (e.g. max response length)"
        )
    return n_seq * float(constant)


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, mode: str, denominator) -> torch.Tensor:
    """The sum of ``per_token`` [B, T] over ``mode``'s units, divided by ``denominator`` (a float
    or a 0-d tensor of ``per_token``'s dtype: the same rounding)."""
    if mode == "seq_mean_token_mean":
        lengths = mask.sum(dim=1).clamp(min=1).to(per_token.dtype)  # [B]
        return (per_token.sum(dim=1) / lengths).sum() / denominator
    return per_token.sum() / denominator


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
    core: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
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
        core: what computes the tensors once the inputs are checked: :func:`loss_core`
            (None), or the ``compile`` option's graph of it.

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
    if weights is not None:
        weights = weights.detach().to(logprobs.dtype)
        weights = weights[:, None] if weights.dim() == 1 else weights  # [B, 1] or [B, T]
        if weights.shape[0] != logprobs.shape[0] or weights.shape[1] not in (1, logprobs.shape[1]):
            raise ValueError(f"weights must be [B] or [B, T], got {tuple(weights.shape)}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"unknown kl_estimator {kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}"
        )
    if kl_coef != 0.0:
        if ref_logprobs is None or tuple(ref_logprobs.shape) != tuple(logprobs.shape):
            raise ValueError("kl_coef != 0 needs ref_logprobs of the shape of logprobs")
        ref_logprobs = ref_logprobs.detach()
    else:
        ref_logprobs = None
    # A 0-d tensor, not a float: the compiled core then takes any count without a new graph.
    denominator = torch.tensor(
        _denominator(mask, aggregation, num_sequences, num_tokens, constant), dtype=logprobs.dtype
    )
    loss, stats = (core or loss_core)(
        spec.terms,
        logprobs,
        old_logprobs.detach(),
        advantages,
        mask,
        weights,
        ref_logprobs,
        denominator,
        clip_low=clip_low,
        clip_high=clip_high,
        aggregation=aggregation,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
        options=tuple(known.items()),
    )
    return loss, loss_metrics.metrics(stats.tolist(), kl=ref_logprobs is not None)


def loss_core(
    terms: TermFn,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    denominator: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    kl_coef: float,
    kl_estimator: str,
    options: tuple[tuple[str, float | None], ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor part of :func:`policy_loss`, its inputs checked: (-J, the metrics' sums
    [len(loss_metrics.STATS)] float64). No Python number is read from a tensor here, so the ``compile``
    option runs it as one graph (:func:`gspo.models.compiled_forward.loss_core`); ``weights``
    [B, 1] or [B, T] and ``ref_logprobs`` (None: no KL term) are detached."""
    t = terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, **dict(options))
    objective = t.objective if weights is None else t.objective * weights  # [B, T]
    loss = -_reduce(objective, mask, aggregation, denominator)
    kl_ref = None
    if ref_logprobs is not None:
        kl_ref = kl_estimate(logprobs, ref_logprobs, mask, kl_estimator)  # [B, T]
        loss = loss + kl_coef * _reduce(kl_ref, mask, aggregation, denominator)
    return loss, loss_metrics.stats(t, logprobs, old_logprobs, mask, kl_ref)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ || π_ref) on samples of π_θ: e^(r-l) - (r-l) - 1, r=ref.

    Non-negative, unbiased, lower variance than log-ratio; 0 off the mask. See ``gspo.core.kl``.
    """
    return kl_estimate(logprobs, ref_logprobs, mask, "k3")  # [B, T]


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
