"""The trainer's side of the objective options: config checks, the loss options of each
algorithm, the KL penalty in the reward and the off-policy sequence mask.

Kept out of ``config.py`` and ``trainer.py`` so those stay small; each function is called from
one line there.
"""

from __future__ import annotations

from typing import Any

import torch

from .kl import KL_ESTIMATORS, sequence_kl_penalty
from .offpolicy import mask_metrics, off_policy_sequence_mask


def validate_options(cfg: Any, need: Any) -> None:
    """Config checks of the options (``need(condition, message)`` collects the problems)."""
    from .losses import LOSSES

    spec = LOSSES.get(cfg.algo)
    need(
        cfg.kl_estimator in KL_ESTIMATORS,
        f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {cfg.kl_estimator!r}",
    )
    if spec is not None:
        clip_set = cfg.clip_low is not None or cfg.clip_high is not None
        need(
            spec.clip_meaning != "unused" or not clip_set,
            f"algo {cfg.algo} has no clip range: leave clip_low/clip_high unset "
            "(its gate temperatures are sapo_tau_pos/sapo_tau_neg)",
        )
        need(
            cfg.dual_clip is None or "dual_clip" in dict(spec.options),
            f"dual_clip applies to grpo only, not to algo {cfg.algo}",
        )
    if cfg.clip_low is not None and (spec is None or spec.clip_meaning in ("ratio", "weight")):
        # 1 - ε_low bounds a ratio from below (1: no lower bound); only GMPO's log-space ε may
        # exceed 1.
        need(cfg.clip_low <= 1, f"clip_low must be in [0, 1], got {cfg.clip_low}")
    need(cfg.dual_clip is None or cfg.dual_clip > 1, f"dual_clip must be > 1, got {cfg.dual_clip}")
    need(
        cfg.sapo_tau_pos > 0 and cfg.sapo_tau_neg > 0,
        f"sapo_tau_pos/sapo_tau_neg must be positive, got {cfg.sapo_tau_pos}, {cfg.sapo_tau_neg}",
    )
    need(
        cfg.off_policy_mask_delta >= 0,
        f"off_policy_mask_delta must be >= 0, got {cfg.off_policy_mask_delta}",
    )
    need(
        cfg.dynamic_sampling_rounds >= 1,
        f"dynamic_sampling_rounds must be >= 1, got {cfg.dynamic_sampling_rounds}",
    )
    need(
        not cfg.kl_in_reward or cfg.kl_coef > 0,
        "kl_in_reward needs kl_coef > 0 (the β of the penalty)",
    )


def loss_options(cfg: Any) -> dict[str, float | None]:
    """The ``options`` of ``policy_loss`` for ``cfg.algo`` (only those the loss declares)."""
    from .losses import get_loss

    values = {"dual_clip": cfg.dual_clip, "tau_pos": cfg.sapo_tau_pos, "tau_neg": cfg.sapo_tau_neg}
    return {k: values[k] for k, _ in get_loss(cfg.algo).options if k in values}


def loss_kl_coef(cfg: Any) -> float:
    """β of the KL term in the loss: 0 when the penalty sits in the reward instead."""
    return 0.0 if cfg.kl_in_reward else cfg.kl_coef


def reward_kl_penalty(cfg: Any, ref_model, rollout, old_logprobs: torch.Tensor):
    """(β Σ_t KL_t per sequence [N] float64, metrics) for ``kl_in_reward``; (None, {}) otherwise.

    The estimate is of the sampling policy against the reference on the rollout's own tokens,
    with ``old_logprobs`` as log π (the value only: rewards carry no gradient).
    """
    if not cfg.kl_in_reward or ref_model is None:
        return None, {}
    from .models import token_logprobs

    with torch.no_grad():
        ref, _ = token_logprobs(
            ref_model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=cfg.temperature,
            prompt_index=rollout.prompt_index,
        )  # [N, L]
    mask = rollout.completion_mask.bool()
    kl = sequence_kl_penalty(old_logprobs.to(ref.dtype), ref, mask, cfg.kl_estimator)  # [N]
    penalty = (cfg.kl_coef * kl).to(torch.float64).cpu()  # [N]
    n_tok = max(int(mask.sum()), 1)
    return penalty, {"kl/ref": float(kl.sum()) / n_tok, "reward/kl_penalty": float(penalty.mean())}


def sequence_weights(
    cfg: Any,
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The off-policy sequence mask [B] (``off_policy_mask``) and its metric, or (None, {})."""
    if not cfg.off_policy_mask:
        return None, {}
    keep = off_policy_sequence_mask(
        logprobs.detach(), behaviour_logprobs, advantages, mask, cfg.off_policy_mask_delta
    )
    return keep, mask_metrics(keep, mask)
