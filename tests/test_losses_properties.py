"""Policy losses' invariants on random inputs (float64): gradients against finite differences,
the GSPO-token formula, micro-batch invariance with a global denominator, and property tests
(hypothesis) of the GSPO family and permutation invariance.

Gradients are of the objective J = -loss with respect to the current log-probs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from losses_support import F64, TOL, grad_of_j, mask_for

from gspo.core.losses import LOSSES, policy_loss
from gspo.core.objectives import (
    AGGREGATIONS,
    sequence_log_ratio,
)

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
