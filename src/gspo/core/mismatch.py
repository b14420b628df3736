"""Trainer glue for the training-inference mismatch: metrics and the optional correction weights.

With ``old_logprobs='recompute'`` the trainer scores the rollout with its own pre-update model
(π_trainer(θ_old)) and compares with the engine's log-probs (π_engine(θ_old), e.g. vLLM's).
``mismatch_correction`` then turns the two into the decoupled objective's behaviour weights
(``gspo.core.correction.mismatch_weights``: TIS truncates ρ at the cap, MIS masks ρ outside
[floor, cap]); the policy loss multiplies its per-token term by them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gspo.core.correction import mismatch_ratio, mismatch_weights

if TYPE_CHECKING:  # a type only: the config's --resume checks import gspo.core, no cycle
    from gspo.config.options_train import LossOptions


def mismatch_stats(
    recomputed: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """``mismatch/mean_abs`` and ``mismatch/max_abs``: |trainer - engine| log-prob over response
    tokens; ``mismatch/seq_log_ratio_abs``: mean |Σ_t (trainer - engine)| per response."""
    keep = mask.bool()  # [N, L]
    delta = (recomputed - engine_logprobs.to(recomputed.dtype)).masked_fill(~keep, 0.0)  # [N, L]
    diff = delta.abs()[keep]
    rows = keep.any(dim=1)  # [N]
    seq = delta.sum(dim=1).abs()[rows]  # [n]
    return {
        "mismatch/mean_abs": float(diff.mean()) if diff.numel() else 0.0,
        "mismatch/max_abs": float(diff.max()) if diff.numel() else 0.0,
        "mismatch/seq_log_ratio_abs": float(seq.mean()) if seq.numel() else 0.0,
    }


def correction_weights(
    cfg: LossOptions, recomputed: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """(weights [N, L] or [N], metrics) of ``cfg.mismatch_correction``; (None, {}) when off.

    ``mismatch/corrected_fraction`` is the share of the correction's units (tokens for level
    'token', responses otherwise) whose weight the cap or floor changed: truncated (TIS) or
    set to 0 (MIS). ``mismatch/weight_mean`` is the mean weight over those units.
    """
    mode = cfg.mismatch_correction
    if mode is None:
        return None, {}
    level = cfg.mismatch_level
    keep = mask.bool()  # [N, L]
    engine = engine_logprobs.to(recomputed.dtype)
    rho = mismatch_ratio(recomputed, engine, keep, level=level)  # [N, L] or [N]
    w = mismatch_weights(
        recomputed,
        engine,
        keep,
        level=level,
        mode=mode,
        cap=cfg.mismatch_cap,
        floor=cfg.mismatch_floor,
    )  # [N, L] or [N]
    units = keep if level == "token" else keep.any(dim=1)  # [N, L] or [N]
    changed = (w != rho) & units
    count = max(int(units.sum()), 1)
    return w, {
        "mismatch/corrected_fraction": float(changed.sum()) / count,
        "mismatch/weight_mean": float(w[units].sum()) / count,
    }
