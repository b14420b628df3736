"""Policy losses against hand-computed values (float64, tight tolerances) and their invariants.

Gradients are of the objective J = -loss with respect to the current log-probs.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gspo.core.loss_terms import (
    AGGREGATIONS,
    LOG_RATIO_CLAMP,
    LossTerms,
    register_loss,
    sequence_log_ratio,
)
from gspo.core.losses import LOSSES, aggregate, get_loss, policy_loss

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-12)


def padded(rows: list[list[float]], width: int | None = None, fill: float = 0.0) -> torch.Tensor:
    width = width or max(len(r) for r in rows)
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=F64)


def mask_for(lengths: list[int], width: int | None = None) -> torch.Tensor:
    width = width or max(lengths)
    return torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.bool)


def grad_of_j(name, new, old, adv, mask, **kw):
    """(J, dJ/dlogprobs, metrics)."""
    lp = new.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, lp, old, adv, mask, **kw)
    (-loss).backward()
    return -loss.item(), lp.grad, metrics


# TV5/TV6 inputs: G = 2, lengths 2 and 4.
OLD = padded([[-1.0, -2.0], [-0.5, -0.5, -0.5, -0.5]])
NEW_OFF = padded([[-0.9, -2.1], [-0.45, -0.55, -0.40, -0.50]])
MASK = mask_for([2, 4])
ADV = torch.tensor([1.0, -1.0], dtype=F64)
WIDE = dict(clip_low=0.2, clip_high=0.2)


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


# ---------------------------------------------------------------- gradient checks (finite diff)


def clips(name: str, clip_low: float, clip_high: float) -> dict:
    """The clip keywords for ``name``: none for a loss without a clip range (SAPO)."""
    if LOSSES[name].clip_meaning == "unused":
        return {}
    return dict(clip_low=clip_low, clip_high=clip_high)


def all_settings():
    out = []
    for name, spec in LOSSES.items():
        if name.startswith("test_"):
            continue
        for agg in spec.aggregations:
            out.append((name, agg))
    return out


@pytest.mark.parametrize("name, agg", all_settings())
def test_gradcheck_random_inputs(name, agg):
    torch.manual_seed(hash((name, agg)) % 1000)
    b, t = 4, 6
    old = -torch.rand(b, t, dtype=F64) * 3
    new = old + 0.3 * torch.randn(b, t, dtype=F64)
    mask = mask_for([6, 3, 1, 5])
    adv = (
        torch.randn(b, t, dtype=F64) if LOSSES[name].token_advantages else torch.randn(b, dtype=F64)
    )
    if name == "gspo_token":
        # With per-token advantages GSPO-token's gradient is by design not the derivative of its
        # value (the stop-gradients); with uniform ones it is (test_gspo_token_formula_random).
        adv = torch.randn(b, 1, dtype=F64).expand(b, t).contiguous()
    kw = dict(clip_low=0.15, clip_high=0.2, aggregation=agg, constant=7.0)
    if LOSSES[name].clip_meaning == "unused":
        kw.update(clip_low=None, clip_high=None)
    shift = (new - old).detach()

    def f(x):
        # CISPO's weight is detached by design: its gradient is the derivative of its value with
        # the ratio held fixed, i.e. with old log-probs that move with x (and are detached).
        o = x - shift if name == "cispo" else old
        return policy_loss(name, x, o, adv, mask, **kw)[0]

    # Nudge away from clip boundaries so the objective is locally smooth.
    assert torch.autograd.gradcheck(
        f, (new.clone().requires_grad_(True),), eps=1e-6, atol=1e-7, rtol=1e-6
    )


def test_gspo_token_formula_random():
    """Unclipped GSPO-token gradient is (1/G) s_i A_{i,t} / |y_i| for random inputs."""
    torch.manual_seed(5)
    b, t = 5, 7
    old = -torch.rand(b, t, dtype=F64) * 2
    new = old + 0.2 * torch.randn(b, t, dtype=F64)
    lengths = [7, 2, 5, 1, 4]
    mask = mask_for(lengths)
    adv = torch.randn(b, t, dtype=F64)
    _, g, m = grad_of_j("gspo_token", new, old, adv, mask, clip_low=0.99, clip_high=1e6)
    s = torch.exp(sequence_log_ratio(new, old, mask))
    expected = s[:, None] * adv / torch.tensor(lengths, dtype=F64)[:, None] / b * mask
    assert torch.allclose(g, expected, **TOL)
    assert m["clip/fraction"] == 0.0


# ---------------------------------------------------------------- TV10 of the issue: micro-batches


@pytest.mark.parametrize("name, agg", all_settings())
def test_micro_batch_invariance(name, agg):
    torch.manual_seed(7)
    b, t = 8, 5
    old = -torch.rand(b, t, dtype=F64) * 2
    new = old + 0.2 * torch.randn(b, t, dtype=F64)
    lengths = [5, 1, 3, 4, 2, 5, 0, 3]  # includes an empty row
    mask = mask_for(lengths, width=t)
    adv = (
        torch.randn(b, t, dtype=F64) if LOSSES[name].token_advantages else torch.randn(b, dtype=F64)
    )
    ref = old + 0.1 * torch.randn(b, t, dtype=F64)
    kw = dict(**clips(name, 0.1, 0.15), aggregation=agg, constant=5.0, kl_coef=0.05)

    full = new.clone().requires_grad_(True)
    loss_full, _ = policy_loss(name, full, old, adv, mask, ref_logprobs=ref, **kw)
    loss_full.backward()

    n_seq = int((mask.sum(1) > 0).sum())
    n_tok = int(mask.sum())
    parts = new.clone().requires_grad_(True)
    total = 0.0
    for idx in torch.arange(b).chunk(4):
        loss_k, _ = policy_loss(
            name,
            parts[idx],
            old[idx],
            adv[idx],
            mask[idx],
            num_sequences=n_seq,
            num_tokens=n_tok,
            ref_logprobs=ref[idx],
            **kw,
        )
        loss_k.backward()
        total += loss_k.item()
    assert total == pytest.approx(loss_full.item(), rel=1e-12, abs=1e-14)
    assert torch.allclose(parts.grad, full.grad, **TOL)


def test_micro_batch_without_global_denominator_differs():
    """Negative control: local denominators do change the gradient (the classic bug)."""
    torch.manual_seed(3)
    old = -torch.rand(4, 4, dtype=F64)
    mask = mask_for([4, 1, 2, 3])
    adv = torch.randn(4, dtype=F64)
    full = old.clone().requires_grad_(True)
    policy_loss("grpo", full, old, adv, mask, aggregation="token_mean")[0].backward()
    parts = old.clone().requires_grad_(True)
    for idx in torch.arange(4).chunk(2):
        policy_loss("grpo", parts[idx], old[idx], adv[idx], mask[idx], aggregation="token_mean")[
            0
        ].backward()
    assert not torch.allclose(parts.grad, full.grad, **TOL)


# ---------------------------------------------------------------- property tests


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    seed=st.integers(0, 10_000),
    scale=st.floats(0.0, 2.0),
)
def test_properties_gspo_family(lengths, seed, scale):
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    new = old + scale * torch.randn(b, t, generator=g, dtype=F64)
    mask = mask_for(lengths)
    adv = torch.randn(b, generator=g, dtype=F64)
    clip = dict(clip_low=0.05, clip_high=0.07)
    _, g_gspo, m = grad_of_j("gspo", new, old, adv, mask, **clip)
    _, g_luspo, _ = grad_of_j("luspo", new, old, adv, mask, **clip)
    _, g_tok, m_t = grad_of_j("gspo_token", new, old, adv, mask, **clip)
    lens = mask.sum(1, keepdim=True).to(F64)
    # LUSPO = |y| × GSPO; GSPO-token = GSPO under uniform advantages.
    assert torch.allclose(g_luspo, lens * g_gspo, rtol=1e-10, atol=1e-12)
    assert torch.allclose(g_tok, g_gspo, rtol=1e-10, atol=1e-12)
    assert m_t["clip/fraction"] == m["clip/fraction"]
    # Every token of a sequence gets the same GSPO gradient; clip fractions are valid shares.
    for i, n in enumerate(lengths):
        row = g_gspo[i, :n]
        assert torch.allclose(row, row[0].expand(n), rtol=1e-12, atol=1e-15)
        assert (g_gspo[i, n:] == 0).all()
    assert 0.0 <= m["clip/fraction"] <= 1.0 and 0.0 <= m["clip/seq_fraction"] <= 1.0
    assert m["ratio/min"] <= m["ratio/mean"] <= m["ratio/max"]


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5), seed=st.integers(0, 10_000))
def test_properties_permutation_invariance(lengths, seed):
    """Reordering sequences (with their masks and advantages) never changes the loss."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    old = -torch.rand(b, t, generator=g, dtype=F64)
    new = old + 0.1 * torch.randn(b, t, generator=g, dtype=F64)
    mask = mask_for(lengths)
    adv = torch.randn(b, generator=g, dtype=F64)
    perm = torch.randperm(b, generator=g)
    for name, agg in all_settings():
        kw = dict(aggregation=agg, constant=6.0, **clips(name, 0.05, 0.05))
        a = policy_loss(name, new, old, adv, mask, **kw)[0]
        p = policy_loss(name, new[perm], old[perm], adv[perm], mask[perm], **kw)[0]
        assert float(p) == pytest.approx(float(a), rel=1e-12, abs=1e-15)


def test_all_aggregations_are_known():
    for spec in LOSSES.values():
        assert set(spec.aggregations) <= set(AGGREGATIONS)
