"""The update's side of the objective options: the loss options of each algorithm, the KL
penalty in the reward, the off-policy sequence mask and the training-inference mismatch's
metrics and correction weights (their config checks are
``gspo.config.validation.validate_options``).

Mismatch: with ``old_logprobs='recompute'`` the trainer scores the rollout with its own
pre-update model (π_trainer(θ_old)) and compares with the engine's log-probs (π_engine(θ_old),
e.g. vLLM's). ``mismatch_correction`` then turns the two into the decoupled objective's
behaviour weights (``gspo.core.correction.mismatch_weights``: TIS truncates ρ at the cap, MIS
masks ρ outside [floor, cap]); the policy loss multiplies its per-token term by them.
"""

from __future__ import annotations

import torch

from gspo.config.options_train import LossOptions
from gspo.config.train import TrainConfig
from gspo.core.correction import mismatch_ratio, mismatch_weights
from gspo.core.kl import sequence_kl_penalty
from gspo.core.losses import get_loss
from gspo.core.offpolicy import mask_metrics, off_policy_sequence_mask
from gspo.models.logprobs import token_logprobs
from gspo.rollout.base import PIXEL_INDEX, PIXELS


def loss_options(cfg: TrainConfig) -> dict[str, float | None]:
    """The ``options`` of ``policy_loss`` for ``cfg.loss.algo`` (only those the loss declares)."""
    values = {
        "dual_clip": cfg.loss.dual_clip,
        "tau_pos": cfg.loss.sapo_tau_pos,
        "tau_neg": cfg.loss.sapo_tau_neg,
    }
    return {k: values[k] for k, _ in get_loss(cfg.loss.algo).options if k in values}


def loss_kl_coef(cfg: TrainConfig) -> float:
    """β of the KL term in the loss: 0 when the penalty sits in the reward instead."""
    return 0.0 if cfg.loss.kl_in_reward else cfg.loss.kl_coef


def reference_logprobs(cfg: TrainConfig, ref_model, rollout) -> torch.Tensor | None:
    """[N, L] log-probs of the frozen reference on the rollout's tokens (None: no reference)."""
    if ref_model is None:
        return None
    with torch.no_grad():
        return rollout_logprobs(ref_model, rollout, cfg.rollout.temperature)  # [N, L]


def rollout_logprobs(model, rollout, temperature: float) -> torch.Tensor:
    """[N, L] ``model``'s log-probs of a whole rollout's completion tokens (each group's prompt
    run once): the reference's, and the recomputed old policy's (``old_logprobs=recompute``)."""
    logprobs, _ = token_logprobs(
        model,
        rollout.prompt_ids,
        rollout.prompt_mask,
        rollout.completion_ids,
        rollout.completion_mask,
        temperature=temperature,
        prompt_index=rollout.prompt_index,
        pixels=rollout.extras.get(PIXELS),
        pixel_index=rollout.extras.get(PIXEL_INDEX),  # episodes' own images
    )
    return logprobs  # [N, L]


def reward_kl_penalty(cfg: TrainConfig, ref_model, rollout, old_logprobs: torch.Tensor):
    """(β Σ_t KL_t per sequence [N] float64, metrics) for ``kl_in_reward``; (None, {}) otherwise.

    The estimate is of the sampling policy against the reference on the rollout's own tokens,
    with ``old_logprobs`` as log π (the value only: rewards carry no gradient).
    """
    if not cfg.loss.kl_in_reward or ref_model is None:
        return None, {}
    ref = reference_logprobs(cfg, ref_model, rollout)  # [N, L]
    mask = rollout.completion_mask.bool()
    kl = sequence_kl_penalty(old_logprobs.to(ref.dtype), ref, mask, cfg.loss.kl_estimator)  # [N]
    penalty = (cfg.loss.kl_coef * kl).to(torch.float64).cpu()  # [N]
    n_tok = max(int(mask.sum()), 1)
    return penalty, {"kl/ref": float(kl.sum()) / n_tok, "reward/kl_penalty": float(penalty.mean())}


def sequence_weights(
    cfg: TrainConfig,
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The off-policy sequence mask [B] (``off_policy_mask``) and its metric, or (None, {})."""
    if not cfg.loss.off_policy_mask:
        return None, {}
    keep = off_policy_sequence_mask(
        logprobs.detach(), behaviour_logprobs, advantages, mask, cfg.loss.off_policy_mask_delta
    )
    return keep, mask_metrics(keep, mask)


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
