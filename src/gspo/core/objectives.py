"""What a policy-loss term function is, the registry of them, the ratio building blocks they
share, and the built-in GRPO, GSPO, LUSPO and GSPO-token term functions.

Each term function turns log-probs, old log-probs and advantages into a per-token objective
matrix [B, T] plus its clip decisions; ``gspo.core.losses.policy_loss`` aggregates it. A loss is
declared once, by the arguments of its ``@register_loss(...)`` decorator (its clip defaults,
aggregations, formula, paper). For a built-in loss (this module's four, in this order, then the
rest of the family in ``gspo.core.losses_family``: CISPO, SAPO, GMPO) they are literals, which
``gspo.config.names.builtin_losses`` reads from the source, so that config checks and
``gspo algos`` know the losses without importing torch. Read the registry through
``gspo.core.losses`` (``get_loss``, ``LOSSES``): that module is the one that loads both term
modules, kept apart from it so that the term modules and the loss need not import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gspo.config.names import AGGREGATIONS

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp, so a ratio is at most
e^20 ≈ 4.9e8: large enough never to bind for sane runs, small enough that exp never overflows into
inf and 0·inf never turns a gradient into NaN."""


@dataclass
class LossTerms:
    """What a term function returns: the per-token objective and the data for clip metrics."""

    objective: torch.Tensor  # [B, T] per-token contribution to J, 0 where mask is 0
    clipped_low: torch.Tensor  # [B, T] bool: gradient zeroed by the lower clip bound
    clipped_high: torch.Tensor  # [B, T] bool: gradient zeroed by the upper clip bound
    ratio: torch.Tensor  # [B] sequence ratios (GSPO family) or [B, T] token ratios (GRPO), detached
    ratio_mask: torch.Tensor  # same shape as ratio: which entries are real


TermFn = Callable[..., LossTerms]


@dataclass(frozen=True)
class LossSpec:
    """A registered policy loss and its paper defaults."""

    name: str
    terms: TermFn
    clip_low: float
    clip_high: float
    default_aggregation: str
    aggregations: tuple[str, ...]
    token_advantages: bool
    """Whether [B, T] per-token advantages are meaningful for this loss."""
    doc: str
    sequence_advantages: bool = False
    """Whether the term function takes one advantage per sequence as [B] (GSPO, LUSPO: their
    term is one clipped value per sequence); otherwise it gets [B, 1] or [B, T]."""
    token_clip: bool = False
    """Whether clip_low/clip_high bound per-token quantities (token ratios, log-ratios or IS
    weights), whose useful ranges are orders of magnitude wider than a sequence ratio's."""
    formula: str = ""
    """One line, for ``gspo algos``."""
    source: str = ""
    """The paper (and arXiv id) the formula and defaults come from."""
    clip_meaning: str = "ratio"
    """What clip_low/clip_high bound: 'ratio' (r in [1-ε_low, 1+ε_high]), 'log-ratio'
    (log r in [-ε_low, ε_high]), 'weight' (a detached IS weight truncated to that band) or
    'unused' (the loss has no clip; setting one is an error)."""
    options: tuple[tuple[str, float | None], ...] = ()
    """Extra keyword options of the term function and their paper defaults (None: off)."""


LOSSES: dict[str, LossSpec] = {}


def register_loss(
    name: str,
    *,
    clip_low: float,
    clip_high: float,
    aggregations: tuple[str, ...],
    token_advantages: bool,
    sequence_advantages: bool = False,
    token_clip: bool = False,
    formula: str = "",
    source: str = "",
    clip_meaning: str = "ratio",
    options: dict[str, float | None] | None = None,
) -> Callable[[TermFn], TermFn]:
    """Register a term function under ``name``; the first aggregation listed is the default."""
    for agg in aggregations:
        if agg not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {agg!r}; valid: {', '.join(AGGREGATIONS)}")

    def decorator(fn: TermFn) -> TermFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered")
        LOSSES[name] = LossSpec(
            name=name,
            terms=fn,
            clip_low=clip_low,
            clip_high=clip_high,
            default_aggregation=aggregations[0],
            aggregations=aggregations,
            token_advantages=token_advantages,
            doc=(fn.__doc__ or "").strip(),
            sequence_advantages=sequence_advantages,
            token_clip=token_clip,
            formula=formula,
            source=source,
            clip_meaning=clip_meaning,
            options=tuple((options or {}).items()),
        )
        return fn

    return decorator


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def masked_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """l - o on response tokens, exactly 0 elsewhere (padding may hold any value, even inf/NaN)."""
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return torch.where(mask, logprobs - old_logprobs, zero)  # [B, T]


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's length-normalized log-ratio: log s_i = (1/|y_i|) Σ_t (l - o), clamped.

    This is the log of the *geometric mean* of token ratios (GSPO Eq. 7), not the full-product
    sequence ratio used by mismatch corrections (see ``gspo.core.correction``). Empty rows give 0.
    """
    lengths = mask.sum(dim=1).clamp(min=1)  # [B]
    mean = masked_log_ratio(logprobs, old_logprobs, mask).sum(dim=1) / lengths  # [B]
    return mean.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B]


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's pessimistic term min(r A, clip(r, 1-ε_low, 1+ε_high) A) and where it is clipped.

    A term is *clipped* when the min picks the clipped branch with a constant value, i.e. its
    gradient is zero: r > 1+ε_high with A > 0, or r < 1-ε_low with A < 0.
    """
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    term = torch.minimum(ratio * advantages, clipped_ratio * advantages)
    r = ratio.detach()
    high = (r > 1.0 + clip_high) & (advantages > 0)
    low = (r < 1.0 - clip_low) & (advantages < 0)
    return term, low, high


@register_loss(
    "grpo",
    clip_low=0.2,
    clip_high=0.28,
    aggregations=("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant"),
    token_advantages=True,
    token_clip=True,
    options={"dual_clip": None},
    formula="min(w A, clip(w, 1-ε_l, 1+ε_h) A) per token, w = π/π_old [; max(·, c A) for A<0]",
    source="DeepSeekMath arXiv 2402.03300 (clip-higher 0.28: DAPO arXiv 2503.14476; dual clip "
    "c: Ye et al. arXiv 1912.09729)",
)
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


@register_loss(
    "gspo",
    clip_low=3e-4,
    clip_high=4e-4,
    aggregations=("seq_mean_token_mean",),
    token_advantages=False,
    sequence_advantages=True,
    formula="(1/G) Σ_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log(π/π_old))",
    source="GSPO, Zheng et al. arXiv 2507.18071 (Eqs. 5-7)",
)
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


@register_loss(
    "luspo",
    clip_low=2e-3,
    clip_high=2.5e-3,
    aggregations=("seq_mean_token_sum",),
    token_advantages=False,
    sequence_advantages=True,
    formula="(1/G) Σ_i |y_i| min(s_i A_i, clip(s_i) A_i), s_i as GSPO",
    source="LUSPO arXiv 2602.05261",
)
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


@register_loss(
    "gspo_token",
    clip_low=3e-4,
    clip_high=4e-4,
    aggregations=("seq_mean_token_mean",),
    token_advantages=True,
    formula="(1/G) Σ_i (1/|y_i|) Σ_t min(s_it A_it, clip(s_it) A_it), s_it = sg[s_i] π/sg[π]",
    source="GSPO, Zheng et al. arXiv 2507.18071 (Eqs. 13-17)",
)
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
