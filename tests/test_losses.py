"""Policy losses against hand-computed values (float64, tight tolerances) and their invariants.

Gradients are of the objective J = -loss with respect to the current log-probs. The registry
and the input checks are in test_losses_registry; invariants on random inputs in
test_losses_properties.
"""

from __future__ import annotations

import math

import pytest
import torch
from losses_support import ADV, F64, MASK, NEW_OFF, OLD, TOL, grad_of_j, mask_for, padded

from gspo.core.losses import aggregate, policy_loss
from gspo.core.objectives import (
    LOG_RATIO_CLAMP,
    sequence_log_ratio,
)

WIDE = dict(clip_low=0.2, clip_high=0.2)


# ---------------------------------------------------------------- TV1: identity


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_token", "luspo"])
def test_identical_policies_ratio_exactly_one(name):
    torch.manual_seed(0)
    old = torch.randn(3, 5, dtype=F64)
    mask = mask_for([5, 2, 3])
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    _, metrics = policy_loss(name, old.clone(), old, adv, mask)
    assert (
        metrics["ratio/mean"] == 1.0 and metrics["ratio/min"] == 1.0 and metrics["ratio/max"] == 1.0
    )
    assert metrics["clip/fraction"] == 0.0 and metrics["clip/seq_fraction"] == 0.0
    assert metrics["kl/old_new"] == 0.0
    s = torch.exp(sequence_log_ratio(old, old, mask))
    assert torch.equal(s, torch.ones(3, dtype=F64))


# ---------------------------------------------------------------- TV2, TV3: the sequence ratio


def test_geometric_mean_and_padding_invariance():
    ratios = [1.10, 0.95, 1.30, 0.90]
    old = torch.full((1, 4), -1.0, dtype=F64)
    new = old + torch.log(torch.tensor([ratios], dtype=F64))
    mask = mask_for([4])
    s = torch.exp(sequence_log_ratio(new, old, mask))
    assert s.item() == pytest.approx(1.0515393714, abs=1e-10)
    assert s.item() == pytest.approx(math.prod(ratios) ** 0.25, rel=1e-13)
    # Padded positions with arbitrary (even non-finite) values change nothing.
    new_p = torch.cat([new, torch.tensor([[5.0, float("nan"), -float("inf")]], dtype=F64)], dim=1)
    old_p = torch.cat([old, torch.tensor([[-3.0, 1.0, float("inf")]], dtype=F64)], dim=1)
    mask_p = mask_for([4], width=7)
    s_p = torch.exp(sequence_log_ratio(new_p, old_p, mask_p))
    assert s_p.item() == s.item()
    for name in ("gspo", "luspo", "gspo_token", "grpo"):
        j, g, m = grad_of_j(name, new, old, torch.tensor([1.0], dtype=F64), mask, **WIDE)
        j_p, g_p, m_p = grad_of_j(
            name, new_p, old_p, torch.tensor([1.0], dtype=F64), mask_p, **WIDE
        )
        assert j_p == pytest.approx(j, rel=1e-14)
        assert torch.isfinite(g_p).all()
        assert torch.allclose(g_p[:, :4], g, **TOL) and (g_p[:, 4:] == 0).all()
        assert m_p == pytest.approx(m, rel=1e-14)


@pytest.mark.parametrize("length", [1, 10, 1000])
def test_length_invariance(length):
    old = torch.zeros(1, length, dtype=F64)
    new = old + 0.01
    s = torch.exp(sequence_log_ratio(new, old, mask_for([length])))
    assert s.item() == pytest.approx(1.010050167084, abs=1e-12)


# ---------------------------------------------------------------- TV4: sequence clip band


@pytest.mark.parametrize(
    "s, a, value, clipped",
    [
        (1.0515, 1.0, 1.0004, True),
        (1.0515, -1.0, -1.0515, False),
        (0.9990, -1.0, -0.9997, True),
        (0.9990, 1.0, 0.9990, False),
        (1.0002, 1.0, 1.0002, False),
        (0.9998, -1.0, -0.9998, False),
        # Between the two bounds (ε_low 3e-4 < |s - 1| < ε_high 4e-4): inside above 1, outside
        # below 1, so swapping ε_low and ε_high flips both.
        (1.00035, 1.0, 1.00035, False),
        (0.99965, -1.0, -0.9997, True),
    ],
)
def test_gspo_clip_band(s, a, value, clipped):
    length = 3
    old = torch.zeros(1, length, dtype=F64)
    new = old + math.log(s)
    j, g, m = grad_of_j("gspo", new, old, torch.tensor([a], dtype=F64), mask_for([length]))
    assert j == pytest.approx(value, rel=1e-12)
    assert m["clip/fraction"] == (1.0 if clipped else 0.0)
    assert m["clip/high_fraction"] == (1.0 if clipped and s > 1 else 0.0)
    assert m["clip/low_fraction"] == (1.0 if clipped and s < 1 else 0.0)
    if clipped:
        assert (g == 0).all()
    else:  # every token gets s·A/|y|
        assert torch.allclose(g, torch.full_like(g, s * a / length), **TOL)


def test_gspo_clip_fractions_token_and_sequence():
    log_s = math.log(1.0515)
    old = torch.zeros(2, 4, dtype=F64)
    new = old + log_s
    mask = mask_for([2, 4])
    _j, g, m = grad_of_j("gspo", new, old, ADV, mask)
    assert m["clip/fraction"] == pytest.approx(2 / 6, rel=1e-15)
    assert m["clip/seq_fraction"] == 0.5
    assert m["clip/high_fraction"] == pytest.approx(2 / 6) and m["clip/low_fraction"] == 0.0
    assert (g[0] == 0).all()
    assert torch.allclose(g[1], torch.full((4,), -1.0515 / 2 / 4, dtype=F64), **TOL)


# ---------------------------------------------------------------- TV5: on-policy gradients


@pytest.mark.parametrize(
    "name, kwargs, j_value, g1, g2",
    [
        ("gspo", {}, 0.0, 0.25, -0.125),
        ("gspo_token", {}, 0.0, 0.25, -0.125),
        ("grpo", {"aggregation": "seq_mean_token_mean"}, 0.0, 0.25, -0.125),
        ("luspo", {}, -1.0, 0.5, -0.5),
        ("grpo", {"aggregation": "token_mean"}, -1 / 3, 1 / 6, -1 / 6),
        ("grpo", {"aggregation": "constant", "constant": 8}, -0.125, 0.0625, -0.0625),
        ("grpo", {"aggregation": "seq_mean_token_sum"}, -1.0, 0.5, -0.5),
    ],
)
def test_on_policy_gradients(name, kwargs, j_value, g1, g2):
    j, g, _ = grad_of_j(name, OLD, OLD, ADV, MASK, **WIDE, **kwargs)
    assert j == pytest.approx(j_value, abs=1e-15)
    expected = padded([[g1, g1], [g2] * 4])
    assert torch.allclose(g, expected, **TOL)


def test_on_policy_gspo_equals_grpo_and_sums():
    _, g_gspo, _ = grad_of_j("gspo", OLD, OLD, ADV, MASK)
    _, g_grpo, _ = grad_of_j("grpo", OLD, OLD, ADV, MASK)
    _, g_luspo, _ = grad_of_j("luspo", OLD, OLD, ADV, MASK)
    assert torch.allclose(g_gspo, g_grpo, **TOL)
    # GSPO's per-sequence gradient sum is length-independent; LUSPO's scales with length.
    assert torch.allclose(g_gspo.sum(1), torch.tensor([0.5, -0.5], dtype=F64), **TOL)
    assert torch.allclose(g_luspo.sum(1), torch.tensor([1.0, -2.0], dtype=F64), **TOL)


# ---------------------------------------------------------------- TV6: off-policy, LUSPO = |y| GSPO


def test_off_policy_values():
    j, g, m = grad_of_j("gspo", NEW_OFF, OLD, ADV, MASK, **WIDE)
    assert j == pytest.approx(-0.0126575603, abs=1e-10)
    assert torch.allclose(g, padded([[0.25, 0.25], [-0.1281643901] * 4]), rtol=0, atol=1e-10)
    assert m["ratio/max"] == pytest.approx(1.0253151205, abs=1e-10)
    assert m["ratio/min"] == pytest.approx(1.0, abs=1e-15)
    j_l, g_l, _ = grad_of_j("luspo", NEW_OFF, OLD, ADV, MASK, **WIDE)
    assert j_l == pytest.approx(-1.0506302410, abs=1e-10)
    assert torch.allclose(g_l, padded([[0.5, 0.5], [-0.5126575603] * 4]), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "clip", [dict(clip_low=0.2, clip_high=0.2), dict(clip_low=3e-4, clip_high=4e-4)]
)
@pytest.mark.parametrize("new", [OLD, NEW_OFF])
def test_luspo_is_length_times_gspo(new, clip):
    _, g_gspo, m_g = grad_of_j("gspo", new, OLD, ADV, MASK, **clip)
    _, g_luspo, m_l = grad_of_j("luspo", new, OLD, ADV, MASK, **clip)
    lengths = MASK.sum(1, keepdim=True).to(F64)
    assert torch.allclose(g_luspo, lengths * g_gspo, **TOL)
    assert m_g["clip/fraction"] == m_l["clip/fraction"]


def test_luspo_with_every_option_on_weighs_length_once():
    """KL penalty and token-level correction weights on: LUSPO's policy gradient is still
    |y_i| × GSPO's, and the KL part is weighted by length once (token sum / G), never L²."""
    torch.manual_seed(1)
    ref = OLD + 0.05 * torch.randn_like(OLD)
    weights = torch.tensor([[0.9, 1.1, 0, 0], [1.0, 0.8, 1.2, 0.7]], dtype=F64)
    kw = dict(ref_logprobs=ref, kl_coef=0.1, weights=weights, clip_low=0.2, clip_high=0.2)
    _, g_l, _ = grad_of_j("luspo", NEW_OFF, OLD, ADV, MASK, **kw)
    _, g_g, _ = grad_of_j("gspo", NEW_OFF, OLD, ADV, MASK, **{**kw, "kl_coef": 0.0})
    # The KL part alone, through the shared k3 estimator, aggregated as a token sum over G.
    lp = NEW_OFF.clone().requires_grad_(True)
    d = (ref - lp) * MASK
    kl = ((torch.exp(d) - d - 1) * MASK).sum() / 2
    kl.backward()
    g_kl = -0.1 * lp.grad
    # The policy part of LUSPO with weights: |y_i| × GSPO's weighted policy gradient.
    _, g_l_pol, _ = grad_of_j("luspo", NEW_OFF, OLD, ADV, MASK, **{**kw, "kl_coef": 0.0})
    lengths = MASK.sum(1, keepdim=True).to(F64)
    assert torch.allclose(g_l_pol, lengths * g_g, **TOL)
    assert torch.allclose(g_l, g_l_pol + g_kl, **TOL)


# ---------------------------------------------------------------- TV7: GSPO-token


@pytest.mark.parametrize("clip", [WIDE, dict(clip_low=3e-4, clip_high=4e-4)])
def test_gspo_token_equals_gspo_under_uniform_advantages(clip):
    j, g, m = grad_of_j("gspo", NEW_OFF, OLD, ADV, MASK, **clip)
    adv_t = ADV[:, None] * MASK.to(F64)
    j_t, g_t, m_t = grad_of_j("gspo_token", NEW_OFF, OLD, adv_t, MASK, **clip)
    j_b, g_b, _ = grad_of_j("gspo_token", NEW_OFF, OLD, ADV, MASK, **clip)
    assert j_t == pytest.approx(j, rel=1e-13, abs=1e-15) and j_b == pytest.approx(
        j, rel=1e-13, abs=1e-15
    )
    assert torch.allclose(g_t, g, **TOL) and torch.allclose(g_b, g, **TOL)
    assert m_t == pytest.approx(m, rel=1e-13)


def test_gspo_token_per_token_advantages():
    adv_t = padded([[1.0, 0.5], [-1.0, -1.0, 0.0, 2.0]])
    _, g, _ = grad_of_j("gspo_token", NEW_OFF, OLD, adv_t, MASK, **WIDE)
    expected = padded([[0.25, 0.125], [-0.1281643901, -0.1281643901, 0.0, 0.2563287801]])
    assert torch.allclose(g, expected, rtol=0, atol=1e-10)


def test_missing_stop_gradient_would_double_the_gradient():
    """Negative control: s_i · π/sg[π] without sg on s_i doubles the gradient; ours does not."""
    lp = NEW_OFF.clone().requires_grad_(True)
    log_s = sequence_log_ratio(lp, OLD, MASK)  # no detach: the bug
    s_t = torch.exp(log_s[:, None] + lp - lp.detach())
    j_bug = ((s_t * ADV[:, None]) * MASK).sum(1) / MASK.sum(1)
    j_bug.mean().backward()
    _, g_ok, _ = grad_of_j("gspo_token", NEW_OFF, OLD, ADV, MASK, **WIDE)
    assert torch.allclose(lp.grad, padded([[0.5, 0.5], [-0.2563287801] * 4]), rtol=0, atol=1e-10)
    assert torch.allclose(lp.grad, 2 * g_ok, **TOL)


# ---------------------------------------------------------------- TV8: GRPO token clipping


@pytest.mark.parametrize(
    "a, w, clipped, weight",
    [
        (1.0, 1.30, True, 0.0),
        (1.0, 0.50, False, 0.5),
        (-1.0, 0.70, True, 0.0),
        (-1.0, 1.50, False, 1.5),
        # Between the bounds 1 - 0.2 and 1 + 0.28 mirrored: 1.25 is inside (above 1 the bound
        # is ε_high = 0.28), 0.75 outside (below 1 it is ε_low = 0.2); a swap flips both.
        (1.0, 1.25, False, 1.25),
        (-1.0, 0.75, True, 0.0),
    ],
)
def test_grpo_token_clipping(a, w, clipped, weight):
    old = torch.zeros(1, 1, dtype=F64)
    new = old + math.log(w)
    _j, g, m = grad_of_j("grpo", new, old, torch.tensor([a], dtype=F64), mask_for([1]))
    assert m["clip/fraction"] == (1.0 if clipped else 0.0)
    assert m["clip/high_fraction"] == (1.0 if clipped and w > 1 else 0.0)
    assert m["clip/low_fraction"] == (1.0 if clipped and w < 1 else 0.0)
    # dJ/dl = A · w for an unclipped token (d w / d l = w).
    assert g.item() == pytest.approx(a * weight, rel=1e-12, abs=0)


# ---------------------------------------------------------------- TV10: aggregation modes


def test_aggregation_modes():
    per_token = padded([[1.0, 3.0], [2.0, 2.0, 2.0, 6.0]])
    assert aggregate(per_token, MASK, "seq_mean_token_mean").item() == pytest.approx(2.5, rel=1e-15)
    assert aggregate(per_token, MASK, "token_mean").item() == pytest.approx(16 / 6, rel=1e-15)
    assert aggregate(per_token, MASK, "seq_mean_token_sum").item() == pytest.approx(8.0, rel=1e-15)
    assert aggregate(per_token, MASK, "constant", constant=8).item() == pytest.approx(
        1.0, rel=1e-15
    )
    with pytest.raises(ValueError, match="positive `constant`"):
        aggregate(per_token, MASK, "constant")


# ---------------------------------------------------------------- numerics


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_token", "luspo"])
def test_huge_log_ratios_stay_finite(name):
    old = torch.zeros(2, 3, dtype=F64)
    new = torch.tensor([[800.0, 900.0, 700.0], [-900.0, -800.0, -1000.0]], dtype=F64)
    j, g, m = grad_of_j(name, new, old, ADV, mask_for([3, 3]), clip_low=0.2, clip_high=0.2)
    assert math.isfinite(j) and torch.isfinite(g).all()
    assert m["ratio/max"] <= math.exp(LOG_RATIO_CLAMP) * (1 + 1e-12)


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_token", "luspo"])
def test_fully_masked_rows_contribute_nothing(name):
    old = padded([[-1.0, -2.0], [-0.5, -0.5, -0.5, -0.5]], width=4)
    new = NEW_OFF.clone()
    # A third, fully masked row holding garbage.
    old3 = torch.cat([old, torch.tensor([[float("nan")] * 4], dtype=F64)])
    new3 = torch.cat([new, torch.tensor([[float("inf")] * 4], dtype=F64)])
    mask3 = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])
    adv3 = torch.cat([ADV, torch.tensor([5.0], dtype=F64)])
    j, g, m = grad_of_j(name, new, old, ADV, MASK, **WIDE)
    j3, g3, m3 = grad_of_j(name, new3, old3, adv3, mask3, **WIDE)
    assert j3 == pytest.approx(j, rel=1e-14, abs=1e-15)
    assert torch.allclose(g3[:2], g, **TOL) and (g3[2] == 0).all()
    assert m3 == pytest.approx(m, rel=1e-14)
    # All rows empty: zero loss, zero gradient, no NaN.
    j0, g0, _ = grad_of_j(name, new3, old3, adv3, torch.zeros_like(mask3), **WIDE)
    assert j0 == 0.0 and (g0 == 0).all()
