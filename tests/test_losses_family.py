"""CISPO, SAPO, GMPO and GRPO's dual clip: float64 values and gradients against hand-computed
closed forms, and cross-checks against peers' formulas as published.

Gradients are of the objective J = -loss with respect to the current log-probs. The registry-wide
checks (gradcheck, micro-batch invariance, permutation invariance) live in
test_losses_properties.py and cover these losses through ``all_settings()``.

Peer formulas are transcribed (never imported) from:
* verl, verl/trainer/ppo/core_algos.py at commit 1dda039b9c6311889a9c9a26040677e1254814f9;
* TRL, trl/trainer/grpo_trainer.py at commit f2cd57710ae345ea6428ae95363267fcf38a3dc8.
"""

from __future__ import annotations

import math

import pytest
import torch

from gspo.core.losses import LOSSES, policy_loss
from gspo.core.losses_family import sapo_gate
from gspo.core.objectives import sequence_log_ratio

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-12)


def mask_for(lengths: list[int], width: int | None = None) -> torch.Tensor:
    width = width or max(lengths)
    return torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.bool)


def grad_of_j(name, new, old, adv, mask, **kw):
    lp = new.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, lp, old, adv, mask, **kw)
    (-loss).backward()
    return -loss.item(), lp.grad, metrics


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def random_batch(seed: int, b: int = 5, t: int = 6, scale: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    new = old + scale * torch.randn(b, t, generator=g, dtype=F64)
    lengths = [t, 2, 5, 1, 4][:b]
    return new, old, mask_for(lengths, t), torch.randn(b, generator=g, dtype=F64)


def test_registry_defaults_of_the_family():
    assert (LOSSES["cispo"].clip_low, LOSSES["cispo"].clip_high) == (1.0, 4.0)
    assert LOSSES["cispo"].default_aggregation == "token_mean"
    assert dict(LOSSES["sapo"].options) == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert dict(LOSSES["sapo_seq"].options) == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert LOSSES["sapo"].clip_meaning == LOSSES["sapo_seq"].clip_meaning == "unused"
    assert (LOSSES["gmpo"].clip_low, LOSSES["gmpo"].clip_high) == (0.4, 0.4)
    assert LOSSES["gmpo"].clip_meaning == "log-ratio"
    assert dict(LOSSES["grpo"].options) == {"dual_clip": None}  # off by default
    for spec in LOSSES.values():
        if not spec.name.startswith("test_"):
            assert spec.formula and spec.source and spec.doc


def test_option_and_clip_errors_are_clear():
    old = torch.zeros(1, 2, dtype=F64)
    mask, adv = mask_for([2]), torch.ones(1, dtype=F64)
    with pytest.raises(ValueError, match="no clip range"):
        policy_loss("sapo", old, old, adv, mask, clip_low=0.2)
    with pytest.raises(ValueError, match="has no option tau_pos; valid: dual_clip"):
        policy_loss("grpo", old, old, adv, mask, options={"tau_pos": 1.0})
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss("grpo", old, old, adv, mask, options={"dual_clip": 1.0})
    with pytest.raises(ValueError, match="temperatures must be positive"):
        policy_loss("sapo", old, old, adv, mask, options={"tau_neg": 0.0})


# ---------------------------------------------------------------------------------- CISPO


def cispo_case():
    # Two sequences (lengths 2 and 1), token ratios 1.2, 6.0 | 0.5; A = +1, -2.
    old = torch.tensor([[-1.0, -2.0], [-0.7, 0.0]], dtype=F64)
    ratios = torch.tensor([[1.2, 6.0], [0.5, 1.0]], dtype=F64)
    new = old + torch.log(ratios)
    return new, old, mask_for([2, 1]), torch.tensor([1.0, -2.0], dtype=F64)


def test_cispo_closed_form_value_and_gradient():
    new, old, mask, adv = cispo_case()
    j, g, m = grad_of_j("cispo", new, old, adv, mask)
    # Weights: clip(1.2) = 1.2, clip(6.0) = cap 1 + 4 = 5, clip(0.5) = 0.5 (no lower bound).
    l1, l2, l3 = -1.0 + math.log(1.2), -2.0 + math.log(6.0), -0.7 + math.log(0.5)
    assert j == pytest.approx((1.2 * 1 * l1 + 5.0 * 1 * l2 + 0.5 * -2 * l3) / 3, rel=1e-13)
    # dJ/dl = weight · A / N_tok for every token: the capped token keeps its gradient (5/3).
    expected = torch.tensor([[1.2 / 3, 5.0 / 3], [-1.0 / 3, 0.0]], dtype=F64)
    assert torch.allclose(g, expected, **TOL)
    assert m["clip/high_fraction"] == pytest.approx(1 / 3) and m["clip/low_fraction"] == 0.0


def test_cispo_no_gradient_through_the_ratio():
    """The gradient is sg(weight)·A: it does not contain the ratio's own derivative, which a
    weight left in the graph would add (d(w l)/dl = w + w l for an unclipped token)."""
    new, old, mask, adv = cispo_case()
    _, g, _ = grad_of_j("cispo", new, old, adv, mask)
    lp = new.clone().requires_grad_(True)
    w = torch.exp(lp - old).clamp(0.0, 5.0)  # the bug: no detach
    ((w * adv[:, None] * lp * mask).sum() / 3).backward()
    assert not torch.allclose(lp.grad, g, rtol=1e-6, atol=1e-6)
    # Plain floats on both sides: pytest.approx of a 0-d tensor is not supported by every pytest.
    expected = g[0, 0].item() + 1.2 * (-1.0 + math.log(1.2)) / 3
    assert lp.grad[0, 0].item() == pytest.approx(expected, rel=1e-12)
    # Moving the old log-probs (hence the weights) of unclipped tokens rescales the gradient
    # linearly and never adds a term: g = w A / N exactly for any weight.
    for shift in (0.05, -0.3):
        _, g2, _ = grad_of_j("cispo", new, old + shift, adv, mask)
        w2 = torch.exp(new - old - shift).clamp(0.0, 5.0) * mask
        assert torch.allclose(g2, w2 * adv[:, None] / 3, **TOL)


def test_cispo_cross_check_verl_and_trl():
    new, old, mask, adv = cispo_case()
    a = adv[:, None].expand_as(new)
    m = mask.to(F64)
    # verl core_algos.py L2078, L2083 (compute_policy_loss_cispo), token-mean aggregation
    # (agg_loss L1170-1171: masked mean over all tokens):
    #   clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    #   pg_losses = -clipped_ratio_sg * advantages * log_prob
    lp = new.clone().requires_grad_(True)
    ratio = torch.exp(torch.clamp(lp - old, min=-20.0, max=20.0))
    clipped_ratio_sg = torch.clamp(ratio, 1 - 1.0, 1 + 4.0).detach()
    verl = ((-clipped_ratio_sg * a * lp) * m).sum() / m.sum()
    verl.backward()
    loss, _ = policy_loss("cispo", new.clone().requires_grad_(True), old, adv, mask)
    assert loss.item() == pytest.approx(verl.item(), rel=1e-13)
    _, g, _ = grad_of_j("cispo", new, old, adv, mask)
    assert torch.allclose(-lp.grad, g, **TOL)
    # TRL grpo_trainer.py L3081-3082: epsilon_high is the cap itself, no lower bound:
    #   clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()
    #   per_token_loss = -clamped_ratios * advantages * per_token_logps
    # TRL's recipe epsilon_high = 5.0 is our clip_low = 1, clip_high = 4.
    trl = ((-torch.clamp(torch.exp(new - old), max=5.0) * a * new) * m).sum() / m.sum()
    assert loss.item() == pytest.approx(trl.item(), rel=1e-13)


# ---------------------------------------------------------------------------------- SAPO


def test_sapo_gate_closed_form():
    r = torch.tensor([1.0, 1.5, 0.5], dtype=F64)
    assert torch.allclose(sapo_gate(r, 1.0), 4 * torch.sigmoid(r - 1), **TOL)
    assert sapo_gate(torch.tensor(1.0, dtype=F64), 1.05).item() == pytest.approx(2 / 1.05)
    # f'(1) = 1 for any τ: on-policy SAPO is plain policy gradient.
    for tau in (0.5, 1.0, 1.05, 3.0):
        x = torch.tensor(1.0, dtype=F64, requires_grad=True)
        sapo_gate(x, tau).backward()
        assert x.grad.item() == pytest.approx(1.0, rel=1e-14)


def test_sapo_token_closed_form():
    # One sequence of 2 tokens with ratios 1.5 and 0.8, A = -1 (τ_neg = 1.05), G = 1.
    old = torch.tensor([[-1.0, -2.0]], dtype=F64)
    new = old + torch.log(torch.tensor([[1.5, 0.8]], dtype=F64))
    j, g, m = grad_of_j("sapo", new, old, torch.tensor([-1.0], dtype=F64), mask_for([2]))
    tau = 1.05
    f = [sigmoid(tau * (r - 1)) * 4 / tau for r in (1.5, 0.8)]
    assert j == pytest.approx(-(f[0] + f[1]) / 2, rel=1e-13)
    # dJ/dl = 4 σ (1 - σ) · r · A / |y|
    d = [4 * sigmoid(tau * (r - 1)) * (1 - sigmoid(tau * (r - 1))) * r * -1 / 2 for r in (1.5, 0.8)]
    assert torch.allclose(g, torch.tensor([d], dtype=F64), **TOL)
    assert m["clip/fraction"] == 0.0
    # A > 0 takes τ_pos = 1.0; custom temperatures through options.
    j2, _, _ = grad_of_j("sapo", new, old, torch.tensor([1.0], dtype=F64), mask_for([2]))
    assert j2 == pytest.approx((4 * sigmoid(0.5) + 4 * sigmoid(-0.2)) / 2, rel=1e-13)
    j3, _, _ = grad_of_j(
        "sapo", new, old, torch.tensor([1.0], dtype=F64), mask_for([2]), options={"tau_pos": 2.0}
    )
    assert j3 == pytest.approx((2 * sigmoid(1.0) + 2 * sigmoid(-0.4)) / 2, rel=1e-13)


@pytest.mark.parametrize("name", ["sapo", "sapo_seq"])
def test_sapo_on_policy_gradient_equals_grpo_and_gspo(name):
    _new, old, mask, adv = random_batch(3)
    _, g, _ = grad_of_j(name, old, old, adv, mask)
    _, g_grpo, _ = grad_of_j("grpo", old, old, adv, mask)
    assert torch.allclose(g, g_grpo, **TOL)


def test_sapo_seq_closed_form():
    new, old, mask, adv = random_batch(4)
    j, g, _ = grad_of_j("sapo_seq", new, old, adv, mask)
    s = torch.exp(sequence_log_ratio(new, old, mask))
    tau = torch.where(adv > 0, torch.tensor(1.0, dtype=F64), torch.tensor(1.05, dtype=F64))
    sig = torch.sigmoid(tau * (s - 1))
    b, lengths = len(adv), mask.sum(1).to(F64)
    assert j == pytest.approx(float((sig * 4 / tau * adv).sum() / b), rel=1e-12)
    expected = (4 * sig * (1 - sig) * s * adv / lengths / b)[:, None] * mask
    assert torch.allclose(g, expected, **TOL)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_sapo_cross_check_verl_and_trl(level):
    new, old, mask, adv = random_batch(5)
    m = mask.to(F64)
    a = adv[:, None]
    lp = new.clone().requires_grad_(True)
    # TRL grpo_trainer.py L3093-3095 (coef_1 is the token ratio, or the (B, 1) sequence ratio
    # exp(mean_t log_ratio) with importance_sampling_level="sequence"):
    #   temperatures = torch.where(advantages > 0, sapo_temperature_pos, sapo_temperature_neg)
    #   soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
    #   per_token_loss = -soft_coef_1 * advantages
    # verl core_algos.py L1656-1658, L1670-1680 is the same token formula.
    log_ratio = lp - old
    if level == "token":
        coef_1 = torch.exp(log_ratio)
    else:
        coef_1 = torch.exp((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    temperatures = torch.where(a > 0, torch.tensor(1.0, dtype=F64), torch.tensor(1.05, dtype=F64))
    soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
    per_token_loss = -soft_coef_1 * a
    # seq-mean-token-mean (verl agg_loss L1194-1197; TRL's "sapo" branch, L3124):
    peer = ((per_token_loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    peer.backward()
    name = "sapo" if level == "token" else "sapo_seq"
    loss, _ = policy_loss(name, new.clone().requires_grad_(True), old, adv, mask)
    assert loss.item() == pytest.approx(peer.item(), rel=1e-12)
    _, g, _ = grad_of_j(name, new, old, adv, mask)
    assert torch.allclose(-lp.grad, g, **TOL)


# ---------------------------------------------------------------------------------- GMPO


@pytest.mark.parametrize(
    "a, kept_mean, grads",
    [
        # A > 0: x̃ = min(x, 0.4) -> [0.1, 0.4, -0.5]; the 0.6 token is clipped (gradient 0).
        (1.0, (0.1 + 0.4 - 0.5) / 3, [1 / 3, 0.0, 1 / 3]),
        # A < 0: x̃ = max(x, -0.4) -> [0.1, 0.6, -0.4]; the -0.5 token is clipped.
        (-1.0, (0.1 + 0.6 - 0.4) / 3, [-1 / 3, -1 / 3, 0.0]),
    ],
)
def test_gmpo_closed_form(a, kept_mean, grads):
    old = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)
    new = old + torch.tensor([[0.1, 0.6, -0.5]], dtype=F64)
    j, g, m = grad_of_j("gmpo", new, old, torch.tensor([a], dtype=F64), mask_for([3]))
    s = math.exp(kept_mean)
    assert j == pytest.approx(s * a, rel=1e-13)
    assert torch.allclose(g, s * torch.tensor([grads], dtype=F64), **TOL)
    assert m["clip/fraction"] == pytest.approx(1 / 3)
    assert m["ratio/mean"] == pytest.approx(s, rel=1e-13)


def test_gmpo_without_clipping_is_geometric_mean_and_on_policy_gspo():
    new, old, mask, adv = random_batch(6, scale=0.1)
    wide = dict(clip_low=50.0, clip_high=50.0)
    _j, g, m = grad_of_j("gmpo", new, old, adv, mask, **wide)
    _, g_gspo, _ = grad_of_j("gspo", new, old, adv, mask, clip_low=0.99, clip_high=1e6)
    assert m["clip/fraction"] == 0.0
    assert torch.allclose(g, g_gspo, **TOL)  # unclipped: (1/G) s_i A_i / |y_i| per token
    _, g_on, _ = grad_of_j("gmpo", old, old, adv, mask)
    _, g_gspo_on, _ = grad_of_j("gspo", old, old, adv, mask)
    assert torch.allclose(g_on, g_gspo_on, **TOL)


def test_gmpo_cross_check_verl():
    new, old, mask, adv = random_batch(7, scale=0.5)
    m = mask.to(F64)
    lp = new.clone().requires_grad_(True)
    advantages = adv[:, None].expand_as(new)
    # verl core_algos.py L1976-1987 (compute_policy_loss_geo_mean), then torch.mean (L2008):
    negative_approx_kl = lp - old
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -0.4, 0.4)
    negative_approx_kl_min = torch.min(
        sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp
    )
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = m.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * m).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * m).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_loss = torch.mean(-advantage * ratio)
    pg_loss.backward()
    loss, _ = policy_loss("gmpo", new.clone().requires_grad_(True), old, adv, mask)
    # verl's +1e-8 in the denominators is the only difference.
    assert loss.item() == pytest.approx(pg_loss.item(), rel=1e-7)
    _, g, _ = grad_of_j("gmpo", new, old, adv, mask)
    assert torch.allclose(-lp.grad, g, rtol=1e-7, atol=1e-12)


# ---------------------------------------------------------------------------------- dual clip


@pytest.mark.parametrize(
    "a, w, dual, value, grad, clipped",
    [
        (-1.0, 4.0, 3.0, -3.0, 0.0, True),  # negative A, ratio past c: capped at c·A, no grad
        (-1.0, 2.0, 3.0, -2.0, -2.0, False),  # below c: the usual unclipped negative branch
        (-1.0, 4.0, None, -4.0, -4.0, False),  # off (default): the ratio pushes unbounded
        (1.0, 4.0, 3.0, 1.28, 0.0, True),  # positive A: the usual upper clip, c unused
        (-1.0, 0.5, 3.0, -0.8, 0.0, True),  # negative A, low ratio: the usual lower clip
    ],
)
def test_dual_clip_closed_form(a, w, dual, value, grad, clipped):
    old = torch.zeros(1, 1, dtype=F64)
    new = old + math.log(w)
    j, g, m = grad_of_j(
        "grpo", new, old, torch.tensor([a], dtype=F64), mask_for([1]), options={"dual_clip": dual}
    )
    assert j == pytest.approx(value, rel=1e-13)
    assert g.item() == pytest.approx(grad, rel=1e-13, abs=0)  # dJ/dl = A·w unclipped
    assert m["clip/fraction"] == (1.0 if clipped else 0.0)


def test_dual_clip_cross_check_verl():
    new, old, mask, _ = random_batch(8, scale=1.5)  # ratios far beyond 3 in both directions
    g_ = torch.Generator().manual_seed(1)
    adv_t = torch.randn(new.shape, generator=g_, dtype=F64) * mask
    m = mask.to(F64)
    lp = new.clone().requires_grad_(True)
    advantages = adv_t
    # verl core_algos.py L1343-1361 (compute_policy_loss_vanilla), clip_ratio_c = 3.0:
    ratio = torch.exp(torch.clamp(lp - old, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - 0.2, 1 + 0.28)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * 3.0
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    verl = (pg_losses * m).sum() / m.sum()  # token-mean
    verl.backward()
    kw = dict(aggregation="token_mean", options={"dual_clip": 3.0})
    loss, _ = policy_loss("grpo", new.clone().requires_grad_(True), old, adv_t, mask, **kw)
    assert loss.item() == pytest.approx(verl.item(), rel=1e-13)
    _, g, _ = grad_of_j("grpo", new, old, adv_t, mask, **kw)
    assert torch.allclose(-lp.grad, g, **TOL)
    # The dual clip did bind somewhere, or this test would not test it.
    assert ((ratio.detach() > 3) & (advantages < 0) & mask).any()


def test_dual_clip_gradcheck():
    new, old, mask, adv = random_batch(9, scale=1.2)

    def f(x):
        return policy_loss("grpo", x, old, adv, mask, options={"dual_clip": 2.0})[0]

    assert torch.autograd.gradcheck(f, (new.clone().requires_grad_(True),), eps=1e-6, atol=1e-7)


def test_dual_clip_micro_batch_invariance():
    new, old, mask, _ = random_batch(10, b=5, scale=1.5)
    adv = torch.randn(new.shape, generator=torch.Generator().manual_seed(2), dtype=F64) * mask
    kw = dict(aggregation="token_mean", options={"dual_clip": 2.0})
    full = new.clone().requires_grad_(True)
    policy_loss("grpo", full, old, adv, mask, **kw)[0].backward()
    parts = new.clone().requires_grad_(True)
    for idx in torch.arange(5).chunk(3):
        policy_loss(
            "grpo", parts[idx], old[idx], adv[idx], mask[idx], num_tokens=int(mask.sum()), **kw
        )[0].backward()
    assert torch.allclose(parts.grad, full.grad, **TOL)
