"""Training-inference mismatch corrections (truncated / masked importance sampling).

When the rollout engine's log-probs serve as old log-probs, the engine and the trainer may give
different probabilities for the same weights (precision, kernels). These weights
ρ = π_train(θ_old) / π_engine(θ_old) re-weight the policy term; they are detached.

Two *different* sequence ratios appear in this field; they are kept apart by name:

* ``level="sequence"``: the full product Π_t ρ_t = exp(Σ_t log ρ_t), the unbiased sequence
  importance weight of the mismatch-correction literature;
* ``level="geometric"``: the geometric mean exp(mean_t log ρ_t), the same construction as GSPO's
  s_i (see ``gspo.core.losses.sequence_log_ratio``), bounded and length-independent.
"""

from __future__ import annotations

import torch

from gspo.config.fields import CORRECTIONS as MODES
from gspo.config.names import MISMATCH_LEVELS as LEVELS
from gspo.core.objectives import LOG_RATIO_CLAMP, masked_log_ratio


def mismatch_weights(
    train_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
    floor: float | None = None,
) -> torch.Tensor:
    """Detached correction weights: [B, T] for ``level="token"``, [B] otherwise.

    ``truncate`` (TIS): min(ρ, cap) (and max(ρ, floor) if given). ``mask`` (MIS / IcePop):
    ρ where floor <= ρ <= cap, else 0 (floor defaults to 0). Masked positions get weight 0 at
    token level; empty rows get weight 1 at sequence level.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown correction level {level!r}; valid: {', '.join(LEVELS)}")
    if mode not in MODES:
        raise ValueError(f"unknown correction mode {mode!r}; valid: {', '.join(MODES)}")
    if cap <= 0 or (floor is not None and not 0 <= floor <= cap):
        raise ValueError(f"need cap > 0 and 0 <= floor <= cap, got cap={cap}, floor={floor}")
    mask = mask.bool()
    with torch.no_grad():
        rho = mismatch_ratio(train_logprobs, engine_logprobs, mask, level=level)
        if mode == "truncate":
            w = rho.clamp(max=cap) if floor is None else rho.clamp(min=floor, max=cap)
        else:
            lo = 0.0 if floor is None else floor
            w = torch.where((rho >= lo) & (rho <= cap), rho, torch.zeros_like(rho))
        return w * mask if level == "token" else w


def mismatch_ratio(
    train_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
) -> torch.Tensor:
    """Detached ρ before any cap: [B, T] (1 where masked) for ``level="token"``, [B] otherwise
    (Π_t ρ_t for "sequence", exp(mean_t log ρ_t) for "geometric"; 1 for empty rows)."""
    if level not in LEVELS:
        raise ValueError(f"unknown correction level {level!r}; valid: {', '.join(LEVELS)}")
    mask = mask.bool()
    with torch.no_grad():
        log_rho = masked_log_ratio(train_logprobs, engine_logprobs, mask)  # [B, T]
        if level == "sequence":
            log_rho = log_rho.sum(dim=1)  # [B]
        elif level == "geometric":
            log_rho = log_rho.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B]
        return torch.exp(log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
