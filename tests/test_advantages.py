"""Group advantages (TV9) and mismatch-correction weights (TV12)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gspo.core.correction import mismatch_weights
from gspo.core.losses import broadcast_to_tokens, group_advantages

F64 = torch.float64


def t(xs):
    return torch.tensor(xs, dtype=F64)


@pytest.mark.parametrize(
    "rewards, scale, expected",
    [
        ([1, 0, 0, 1], "std", [1, -1, -1, 1]),
        ([1, 0, 0, 1], "sample_std", [0.8660254038] * 1 + [-0.8660254038] * 2 + [0.8660254038]),
        ([1, 0, 0, 1], "none", [0.5, -0.5, -0.5, 0.5]),
        ([1, 0, 0, 0], "std", [1.7320508076, -0.5773502692, -0.5773502692, -0.5773502692]),
        ([1, 0, 0, 0], "sample_std", [1.5, -0.5, -0.5, -0.5]),
        ([1, 0, 0, 0], "none", [0.75, -0.25, -0.25, -0.25]),
    ],
)
def test_known_values(rewards, scale, expected):
    adv = group_advantages(t(rewards), 4, scale=scale, eps=0.0)
    assert torch.allclose(adv, t(expected), rtol=0, atol=1e-10)


def test_eps_is_added_to_the_std():
    adv = group_advantages(t([1, 0, 0, 1]), 4, eps=1e-6)
    assert adv[0].item() == pytest.approx(0.5 / (0.5 + 1e-6), rel=1e-14)  # centred 0.5, std 0.5
    # The default eps is that same 1e-6 (what the trainer uses: it passes none).
    assert torch.equal(group_advantages(t([1, 0, 0, 1]), 4), adv)


@pytest.mark.parametrize("scale", ["std", "sample_std", "none"])
@pytest.mark.parametrize("value", [1.0, 0.0, 0.1, -3.7, 1e9])
def test_equal_rewards_give_exact_zeros(scale, value):
    adv = group_advantages(t([value] * 4 + [1, 0, 1, 0]), 4, scale=scale, eps=0.0)
    assert (adv[:4] == 0).all() and torch.isfinite(adv).all()
    assert (adv[4:] != 0).all()


def test_groups_are_independent_and_size_one():
    adv = group_advantages(t([1, 0, 5, 3]), 2, eps=0.0)
    assert torch.allclose(adv, t([1, -1, 1, -1]), rtol=0, atol=1e-15)
    assert (group_advantages(t([1, 0, 5]), 1) == 0).all()


def test_bad_input():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(t([1, 0, 0, 1]), 3)
    with pytest.raises(
        ValueError, match="unknown advantage scale 'mad'; valid: std, sample_std, none"
    ):
        group_advantages(t([1, 0]), 2, scale="mad")
    with pytest.raises(ValueError, match="finite"):
        group_advantages(t([1, math.inf]), 2)
    with pytest.raises(ValueError, match=r"\[B\]"):
        group_advantages(t([[1, 0]]), 2)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=8),
    st.integers(1, 4),
    st.sampled_from(["std", "sample_std", "none"]),
)
def test_properties(values, n_groups, scale):
    g = len(values)
    rewards = t(values * n_groups)
    adv = group_advantages(rewards, g, scale=scale)
    assert torch.isfinite(adv).all()
    sums = adv.view(n_groups, g).sum(1)
    assert torch.allclose(sums, torch.zeros_like(sums), atol=1e-9)
    # Ordering is preserved: a better reward never gets a smaller advantage.
    order = torch.argsort(rewards[:g])
    assert (adv[:g][order].diff() >= -1e-12).all()


def test_broadcast_to_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    out = broadcast_to_tokens(t([2.0, -1.0]), mask)
    assert torch.equal(out, t([[2, 2, 0], [-1, 0, 0]]))


# ---------------------------------------------------------------- TV12: correction weights


def correction_inputs():
    rho = t([[0.4, 1.0, 2.5, 4.0]])
    engine = t([[-1.0, -2.0, -0.5, -3.0]])
    return engine + torch.log(rho), engine, torch.ones(1, 4, dtype=torch.bool)


def test_token_tis_and_mis():
    train, engine, mask = correction_inputs()
    tis = mismatch_weights(train, engine, mask, level="token", mode="truncate", cap=2.0)
    assert torch.allclose(tis, t([[0.4, 1, 2, 2]]), rtol=1e-14)
    mis = mismatch_weights(train, engine, mask, level="token", mode="mask", cap=2.0, floor=0.5)
    assert torch.allclose(mis, t([[0, 1, 0, 0]]), rtol=1e-14)


def test_sequence_levels_are_different_objects():
    train, engine, mask = correction_inputs()
    geo = mismatch_weights(train, engine, mask, level="geometric", mode="truncate", cap=2.0)
    assert geo.item() == pytest.approx(math.sqrt(2), rel=1e-13)
    kept = mismatch_weights(train, engine, mask, level="geometric", mode="mask", cap=2.0, floor=0.5)
    assert kept.item() == pytest.approx(math.sqrt(2), rel=1e-13)
    full = mismatch_weights(train, engine, mask, level="sequence", mode="truncate", cap=100.0)
    assert full.item() == pytest.approx(0.4 * 1.0 * 2.5 * 4.0, rel=1e-13)


def test_weights_are_detached_and_validated():
    train, engine, mask = correction_inputs()
    train = train.clone().requires_grad_(True)
    w = mismatch_weights(train, engine, mask)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="unknown correction level"):
        mismatch_weights(train, engine, mask, level="turn")
    with pytest.raises(ValueError, match="cap > 0"):
        mismatch_weights(train, engine, mask, cap=0.0)
