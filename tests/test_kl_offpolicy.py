"""KL estimators (k1, k2, k3, k3+) and off-policy sequence masking: closed forms, the gradients
each estimator claims (exact expectations over a small categorical), micro-batch invariance and
peers' formulas transcribed (verl core_algos.py at 1dda039b9c6311889a9c9a26040677e1254814f9,
TRL grpo_trainer.py at f2cd57710ae345ea6428ae95363267fcf38a3dc8)."""

from __future__ import annotations

import math

import pytest
import torch

from gspo.core.kl import KL_ESTIMATORS, kl_estimate, sequence_kl_penalty
from gspo.core.losses import policy_loss
from gspo.core.offpolicy import DEFAULT_DELTA, mask_metrics, off_policy_sequence_mask

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-13)

L = torch.tensor([[-0.5, -2.0, -1.2]], dtype=F64)  # log π_θ of three sampled tokens
R = torch.tensor([[-0.7, -1.0, -1.2]], dtype=F64)  # log π_ref
MASK = torch.ones(1, 3, dtype=torch.bool)


def value_and_grad(estimator: str):
    lp = L.clone().requires_grad_(True)
    k = kl_estimate(lp, R, MASK, estimator)
    k.sum().backward()
    return k.detach(), lp.grad


@pytest.mark.parametrize(
    "estimator, value, grad",
    [
        ("k1", lambda d: d, lambda d: 1.0),
        ("k2", lambda d: 0.5 * d * d, lambda d: d),
        ("k3", lambda d: math.exp(-d) + d - 1, lambda d: 1 - math.exp(-d)),
        ("k3+", lambda d: math.exp(-d) + d - 1, lambda d: d),  # k3 value, k2 gradient
    ],
)
def test_estimator_closed_forms(estimator, value, grad):
    k, g = value_and_grad(estimator)
    for t in range(3):
        d = float(L[0, t] - R[0, t])  # l - r
        assert k[0, t].item() == pytest.approx(value(d), rel=1e-13, abs=1e-15)
        assert g[0, t].item() == pytest.approx(grad(d), rel=1e-13, abs=1e-15)


def test_estimators_zero_padding_and_unknown_name():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    lp = torch.tensor([[-0.5, -2.0, float("nan")]], dtype=F64, requires_grad=True)
    for est in KL_ESTIMATORS:
        k = kl_estimate(lp, R, mask, est)
        assert k[0, 2] == 0 and torch.isfinite(k).all()
    with pytest.raises(ValueError, match="unknown kl_estimator 'k4'"):
        kl_estimate(L, R, MASK, "k4")
    with pytest.raises(ValueError, match="unknown kl_estimator"):
        policy_loss("gspo", L, L, torch.ones(1, dtype=F64), MASK, kl_estimator="kl")


def categorical(seed: int, n: int = 7):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(n, generator=g, dtype=F64).requires_grad_(True)
    ref = torch.log_softmax(torch.randn(n, generator=g, dtype=F64), dim=0)
    return theta, ref


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimator_expectations_and_gradients_exactly(seed):
    """Over every outcome y of a categorical π_θ = softmax(θ), weighted by π_θ(y) (the exact
    expectation of a sampled estimate): k1 and k3 are unbiased for KL(π_θ||π_ref); the loss
    gradient (sampled outcomes held fixed) of k2 and k3+ is exactly ∇KL(π_θ||π_ref), k1's is 0
    and k3's is ∇KL(π_ref||π_θ), the forward KL."""
    theta, ref = categorical(seed)
    logp = torch.log_softmax(theta, dim=0)
    p = logp.exp()
    kl_rev = (p * (logp - ref)).sum()
    kl_fwd = (ref.exp() * (ref - logp)).sum()
    grad_rev = torch.autograd.grad(kl_rev, theta, retain_graph=True)[0]
    grad_fwd = torch.autograd.grad(kl_fwd, theta, retain_graph=True)[0]
    mask = torch.ones(1, len(theta), dtype=torch.bool)
    for est in KL_ESTIMATORS:
        k = kl_estimate(logp[None], ref[None], mask, est)[0]  # one "sample" per outcome
        expectation = (p.detach() * k).sum()
        grad = torch.autograd.grad(expectation, theta, retain_graph=True)[0]
        if est in ("k1", "k3", "k3+"):
            assert expectation.item() == pytest.approx(kl_rev.item(), rel=1e-12)
        else:  # k2 is biased
            assert expectation.item() != pytest.approx(kl_rev.item(), rel=1e-3)
        expected = {"k1": torch.zeros_like(theta), "k3": grad_fwd}.get(est, grad_rev)
        assert torch.allclose(grad, expected, rtol=1e-11, atol=1e-13), est


def test_estimators_cross_check_verl():
    lp = L.clone().requires_grad_(True)
    # verl core_algos.py L2227-2228 (k1), L2233-2234 (k2), L2238-2244 (k3) and L2210-2212 (k3+):
    k1 = lp - R
    k2 = 0.5 * (lp - R).square()
    kl = torch.clamp(R - lp, min=-20, max=20)
    k3 = torch.clamp((torch.exp(kl) - kl - 1), min=-10, max=10)  # verl's ±10 clamp: not hit here
    backward_score = 0.5 * (lp - R).square()
    k3p = backward_score - backward_score.detach() + k3.detach()
    for est, peer in (("k1", k1), ("k2", k2), ("k3", k3), ("k3+", k3p)):
        ours_lp = L.clone().requires_grad_(True)
        ours = kl_estimate(ours_lp, R, MASK, est)
        assert torch.allclose(ours, peer.detach(), **TOL)
        (g_peer,) = torch.autograd.grad(peer.sum(), lp, retain_graph=True)
        ours.sum().backward()
        assert torch.allclose(ours_lp.grad, g_peer, **TOL)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_in_loss_gradient_and_micro_batch_invariance(estimator):
    g = torch.Generator().manual_seed(4)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=g, dtype=F64) * 2
    new = old + 0.2 * torch.randn(b, t, generator=g, dtype=F64)
    ref = old + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.tensor([[1] * n + [0] * (t - n) for n in [5, 1, 3, 4, 2, 5]], dtype=torch.bool)
    adv = torch.zeros(b, dtype=F64)  # policy term 0: the gradient is the KL term's alone
    kw = dict(kl_coef=0.1, kl_estimator=estimator, ref_logprobs=ref, aggregation="token_mean")
    full = new.clone().requires_grad_(True)
    policy_loss("grpo", full, old, adv, mask, **kw)[0].backward()
    d = (new - ref) * mask
    claimed = {"k1": torch.ones_like(d), "k2": d, "k3": 1 - torch.exp(-d), "k3+": d}[estimator]
    assert torch.allclose(full.grad, 0.1 * claimed * mask / mask.sum(), **TOL)
    parts = new.clone().requires_grad_(True)
    for idx in torch.arange(b).chunk(3):
        sub = dict(kw, ref_logprobs=ref[idx])
        policy_loss(
            "grpo", parts[idx], old[idx], adv[idx], mask[idx], num_tokens=int(mask.sum()), **sub
        )[0].backward()
    assert torch.allclose(parts.grad, full.grad, **TOL)


def test_sequence_kl_penalty_sums_tokens_without_gradient():
    lp = L.clone().requires_grad_(True)
    pen = sequence_kl_penalty(lp, R, MASK, "k3")
    assert not pen.requires_grad
    expected = sum(
        math.exp(-(a - b)) + (a - b) - 1 for a, b in zip(L[0].tolist(), R[0].tolist(), strict=True)
    )
    assert pen.item() == pytest.approx(expected, rel=1e-13)


# ---------------------------------------------------------------------------------- OPSM


def opsm_case():
    # Behaviour (engine) log-probs μ and current π: per-sequence mean of (log μ - log π) is
    # 0.6, 0.6, 0.2, 0.5 (exactly δ), 0.9 (one token of three, the rest padding).
    behaviour = torch.zeros(5, 3, dtype=F64)
    current = -torch.tensor(
        [[0.6, 0.6, 0.6], [0.3, 0.9, 0.6], [0.2, 0.2, 0.2], [0.5, 0.5, 0.5], [0.9, 7.0, 7.0]],
        dtype=F64,
    )
    mask = torch.tensor([[1, 1, 1]] * 4 + [[1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0, -0.5], dtype=F64)
    return current, behaviour, adv, mask


def test_off_policy_mask_closed_form():
    current, behaviour, adv, mask = opsm_case()
    keep = off_policy_sequence_mask(current, behaviour, adv, mask, delta=0.5)
    # Dropped: A < 0 and mean KL > δ: rows 0 and 4. Row 1 has A > 0; row 2 KL 0.2 <= δ;
    # row 3 KL == δ is kept (the paper's and TRL's strict '>').
    assert keep.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert mask_metrics(keep, mask) == {"opsm/masked_fraction": pytest.approx(2 / 5)}
    assert off_policy_sequence_mask(current, behaviour, adv, mask, 1e-4).tolist() == [0, 1, 0, 0, 0]
    # Per-token advantages: a sequence is negative when its token mean is.
    adv_t = adv[:, None].expand(5, 3) * mask
    assert torch.equal(off_policy_sequence_mask(current, behaviour, adv_t, mask, 0.5), keep)
    assert DEFAULT_DELTA == 0.5
    with pytest.raises(ValueError, match="delta must be >= 0"):
        off_policy_sequence_mask(current, behaviour, adv, mask, -1.0)


def test_off_policy_mask_cross_check_trl():
    current, behaviour, adv, mask = opsm_case()
    m = mask.to(F64)
    advantages = adv[:, None]
    # TRL grpo_trainer.py L2932-2939 (get_off_policy_mask), off_policy_threshold = δ:
    kl_div = behaviour - current.detach()
    seq_kl_sum = (kl_div * m).sum(dim=1, keepdim=True)
    avg_seq_kl = seq_kl_sum / m.sum(dim=1, keepdim=True).clamp(min=1.0)
    for delta in (1e-4, 0.3, 0.5, 2.0):
        is_pos_adv = advantages >= 0
        is_low_kl = avg_seq_kl <= delta
        trl = (is_pos_adv | is_low_kl).to(dtype=m.dtype)[:, 0]
        assert torch.equal(off_policy_sequence_mask(current, behaviour, adv, mask, delta), trl)


def test_off_policy_mask_zeroes_exactly_the_dropped_sequences_gradient():
    current, behaviour, adv, mask = opsm_case()
    keep = off_policy_sequence_mask(current, behaviour, adv, mask, 0.5)
    old = current + 0.01  # old log-probs (the ratio) are independent of the mask's behaviour
    lp = current.clone().requires_grad_(True)
    policy_loss("grpo", lp, old, adv, mask, weights=keep)[0].backward()
    ref = current.clone().requires_grad_(True)
    policy_loss("grpo", ref, old, adv, mask)[0].backward()
    assert (lp.grad[keep == 0] == 0).all()
    assert torch.allclose(lp.grad[keep == 1], ref.grad[keep == 1], **TOL)
    # Per-sequence masks computed on micro-batches are the full batch's mask.
    parts = torch.cat(
        [
            off_policy_sequence_mask(current[i], behaviour[i], adv[i], mask[i], 0.5)
            for i in torch.arange(5).chunk(3)
        ]
    )
    assert torch.equal(parts, keep)
