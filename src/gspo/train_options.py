"""Moved: `validate_options` to `gspo.config.validation`, the loss options, the KL penalty in
the reward and the off-policy sequence mask to `gspo.backend.options`. This path re-exports every
name it had so existing imports keep working."""

from gspo.backend.options import (
    loss_kl_coef,
    loss_options,
    mask_metrics,
    off_policy_sequence_mask,
    reward_kl_penalty,
    sequence_kl_penalty,
    sequence_weights,
)
from gspo.config.validation import validate_options
from gspo.core.kl import KL_ESTIMATORS

__all__ = [
    "KL_ESTIMATORS",
    "loss_kl_coef",
    "loss_options",
    "mask_metrics",
    "off_policy_sequence_mask",
    "reward_kl_penalty",
    "sequence_kl_penalty",
    "sequence_weights",
    "validate_options",
]
