"""The loss registry and the losses' input checks: defaults, registering a new variant,
one advantage per sequence for a registered sequence loss, unsupported aggregations, and
clear errors for bad shapes, token advantages given to sequence losses, and bad clip or
mask values.
"""

from __future__ import annotations

import pytest
import torch
from losses_support import ADV, F64, MASK, NEW_OFF, OLD, TOL, grad_of_j, padded

from gspo.core.losses import LOSSES, aggregate, get_loss, policy_loss
from gspo.core.objectives import (
    LossTerms,
    register_loss,
)


def test_registry_and_defaults():
    assert set(LOSSES) >= {"grpo", "gspo", "gspo_token", "luspo"}
    assert (LOSSES["gspo"].clip_low, LOSSES["gspo"].clip_high) == (3e-4, 4e-4)
    assert (LOSSES["gspo_token"].clip_low, LOSSES["gspo_token"].clip_high) == (3e-4, 4e-4)
    assert (LOSSES["luspo"].clip_low, LOSSES["luspo"].clip_high) == (2e-3, 2.5e-3)
    assert (LOSSES["grpo"].clip_low, LOSSES["grpo"].clip_high) == (0.2, 0.28)
    assert LOSSES["grpo"].default_aggregation == "seq_mean_token_mean"
    with pytest.raises(
        ValueError, match="valid: cispo, gmpo, grpo, gspo, gspo_token, luspo, sapo, sapo_seq"
    ):
        get_loss("ppo2")
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss("nope", OLD, OLD, ADV, MASK)


def test_register_new_variant_through_registry():
    """A new variant (plain REINFORCE) plugs in by registering a term function."""
    name = "test_reinforce"

    @register_loss(
        name, clip_low=0.0, clip_high=0.0, aggregations=("token_mean",), token_advantages=True
    )
    def reinforce_terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
        lp = torch.where(mask, logprobs, torch.zeros_like(logprobs))
        never = torch.zeros_like(mask)
        return LossTerms(
            objective=torch.exp(lp - lp.detach()) * advantages * mask,
            clipped_low=never,
            clipped_high=never,
            ratio=torch.ones(mask.shape[0], dtype=logprobs.dtype),
            ratio_mask=mask.any(dim=1),
        )

    try:
        _, g, m = grad_of_j(name, NEW_OFF, OLD, ADV, MASK)
        assert torch.allclose(g, padded([[1 / 6, 1 / 6], [-1 / 6] * 4]), **TOL)
        assert m["clip/fraction"] == 0.0
        with pytest.raises(ValueError, match="already registered"):
            register_loss(
                name, clip_low=0, clip_high=0, aggregations=("token_mean",), token_advantages=True
            )(reinforce_terms)
    finally:
        del LOSSES[name]


def test_a_registered_sequence_loss_gets_one_advantage_per_sequence():
    """``sequence_advantages`` on the spec, not the loss's name, decides the advantages' shape."""
    shapes = {}

    def terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
        shapes[name] = tuple(advantages.shape)
        never = torch.zeros_like(mask)
        return LossTerms(
            objective=advantages.reshape(mask.shape[0], -1) * mask * logprobs,
            clipped_low=never,
            clipped_high=never,
            ratio=torch.ones(mask.shape[0], dtype=logprobs.dtype),
            ratio_mask=mask.any(dim=1),
        )

    for name, per_sequence in (("test_seq_adv", True), ("test_col_adv", False)):
        register_loss(
            name,
            clip_low=0.0,
            clip_high=0.0,
            aggregations=("token_mean",),
            token_advantages=False,
            sequence_advantages=per_sequence,
        )(terms)
    try:
        for name in ("test_seq_adv", "test_col_adv"):
            policy_loss(name, OLD.clone(), OLD, ADV, MASK)
    finally:
        del LOSSES["test_seq_adv"], LOSSES["test_col_adv"]
    assert shapes == {"test_seq_adv": (2,), "test_col_adv": (2, 1)}
    assert [n for n, s in LOSSES.items() if s.sequence_advantages] == ["gspo", "luspo"]


def test_unsupported_aggregation_is_rejected():
    with pytest.raises(
        ValueError, match="does not support aggregation 'token_mean'; valid: seq_mean_token_mean"
    ):
        policy_loss("gspo", OLD, OLD, ADV, MASK, aggregation="token_mean")
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(OLD, MASK, "sum")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(old_logprobs=OLD[:, :3]), "old_logprobs must have the shape"),
        (dict(mask=MASK[:1]), "mask must have the shape"),
        (dict(advantages=ADV[:, None]), "advantages must be"),
        (dict(advantages=torch.ones(3, dtype=F64)), "advantages must be"),
        (dict(logprobs=OLD[0]), "logprobs must be"),
    ],
)
def test_shape_errors_are_clear(kwargs, message):
    args = dict(logprobs=OLD, old_logprobs=OLD, advantages=ADV, mask=MASK)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        policy_loss("gspo", **args)


def test_sequence_losses_refuse_token_advantages():
    with pytest.raises(ValueError, match="'gspo_token'"):
        policy_loss("gspo", OLD, OLD, ADV[:, None] * MASK, MASK)
    with pytest.raises(ValueError, match="per-token advantages"):
        policy_loss("luspo", OLD, OLD, ADV[:, None] * MASK, MASK)


def test_bad_clip_and_mask_values():
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss("grpo", OLD, OLD, ADV, MASK, clip_low=1.5)
    with pytest.raises(ValueError, match="only 0 and 1"):
        policy_loss("grpo", OLD, OLD, ADV, MASK.to(F64) * 2)
