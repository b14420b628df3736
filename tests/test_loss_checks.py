"""Loss details the hand-computed tests in test_losses.py left open, found by mutation testing
(scripts/mutation.sh, docs/testing.md): metric values by hand, the KL estimator's value, clip
bookkeeping of zero and small advantages, the log-ratio clamp, integer masks, per-sequence
weights and the argument checks."""

from __future__ import annotations

import math

import pytest
import torch

from gspo.core.losses import LOSSES, aggregate, k3_kl, policy_loss
from gspo.core.objectives import LOG_RATIO_CLAMP, LossTerms, register_loss

F64 = torch.float64


def k3(d: float) -> float:
    """k3 of one token, d = ref - logprob: e^d - d - 1."""
    return math.exp(d) - d - 1.0


def test_k3_kl_values_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)  # [1, 3]
    ref = torch.tensor([[-1.5, -1.0, 9.0]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    got = k3_kl(lp, ref, mask)
    want = torch.tensor([[k3(-0.5), k3(1.0), 0.0]], dtype=F64)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    # The log-ratio is clamped to ±LOG_RATIO_CLAMP at both ends before exp.
    far = k3_kl(torch.zeros(1, 2, dtype=F64), torch.tensor([[-50.0, 50.0]], dtype=F64), mask[:, :2])
    c = LOG_RATIO_CLAMP
    torch.testing.assert_close(far, torch.tensor([[k3(-c), k3(c)]], dtype=F64), rtol=1e-14, atol=0)


def test_kl_metrics_and_kl_loss_by_hand():
    old = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=F64)
    new = torch.tensor([[-0.8, -2.3], [-0.6, 0.0]], dtype=F64)
    ref = torch.tensor([[-1.1, -2.0], [-0.2, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    kw = dict(clip_low=0.5, clip_high=0.5, aggregation="token_mean")
    plain, m0 = policy_loss("grpo", new, old, adv, mask, **kw)
    loss, m = policy_loss("grpo", new, old, adv, mask, ref_logprobs=ref, kl_coef=0.3, **kw)
    tokens = [(0, 0), (0, 1), (1, 0)]
    kl_ref = sum(k3(float(ref[i, t] - new[i, t])) for i, t in tokens) / 3
    kl_old = sum(k3(float(new[i, t] - old[i, t])) for i, t in tokens) / 3
    assert m["kl/ref"] == pytest.approx(kl_ref, rel=1e-13)
    assert m0["kl/old_new"] == pytest.approx(kl_old, rel=1e-13)
    assert float(loss - plain) == pytest.approx(0.3 * kl_ref, rel=1e-12)
    assert "kl/ref" not in m0
    # One token: the per-token means divide by 1.
    one = torch.ones(1, 1, dtype=torch.bool)
    _, m1 = policy_loss(
        "grpo", new[:1, :1], old[:1, :1], adv[:1], one, ref_logprobs=ref[:1, :1], kl_coef=0.3
    )
    assert m1["kl/ref"] == pytest.approx(k3(float(ref[0, 0] - new[0, 0])), rel=1e-13)
    assert m1["kl/old_new"] == pytest.approx(k3(float(new[0, 0] - old[0, 0])), rel=1e-13)


def test_clip_bookkeeping_by_hand():
    # GRPO, 1 row of 5 tokens: ratios 1.5 (A 0), 0.5 (A 0.5), 0.5 (A -0.5), 1.5 (A 2), 0.5 (A 0).
    w = torch.tensor([[1.5, 0.5, 0.5, 1.5, 0.5]], dtype=F64)
    adv = torch.tensor([[0.0, 0.5, -0.5, 2.0, 0.0]], dtype=F64)  # [1, 5] per token
    mask = torch.ones(1, 5, dtype=torch.bool)
    _, m = policy_loss("grpo", w.log(), torch.zeros_like(w), adv, mask, clip_low=0.2, clip_high=0.2)
    # Zero advantage: no gradient either way, but nothing is *clipped*; A > 0 is not clipped
    # below 1 - ε. Clipped: token 3 (low, A < 0) and token 4 (high, A > 0).
    assert m["clip/low_fraction"] == 0.2 and m["clip/high_fraction"] == 0.2
    assert m["clip/fraction"] == 0.4 and m["clip/seq_fraction"] == 1.0
    assert m["ratio/count"] == 5.0
    assert (m["ratio/min"], m["ratio/max"]) == pytest.approx((0.5, 1.5), rel=1e-14)


@pytest.mark.parametrize("algo", ["gspo", "luspo", "gspo_token"])
def test_single_sequence_metrics(algo):
    s = 1.02
    new = torch.full((1, 3), math.log(s), dtype=F64)
    _, m = policy_loss(
        algo, new, torch.zeros_like(new), torch.tensor([1.0], dtype=F64), torch.ones(1, 3) > 0
    )
    assert m["ratio/mean"] == pytest.approx(s, rel=1e-14)  # one ratio is still a ratio
    assert m["ratio/count"] == 1.0
    assert m["clip/seq_fraction"] == 1.0 and m["clip/high_fraction"] == 1.0


def test_empty_batch_metrics_are_neutral():
    z = torch.zeros(2, 3, dtype=F64)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, m = policy_loss("gspo", z, z, torch.ones(2, dtype=F64), mask)
    assert float(loss) == 0.0
    assert (m["ratio/mean"], m["ratio/min"], m["ratio/max"]) == (1.0, 1.0, 1.0)
    assert m["ratio/count"] == 0.0 and m["clip/fraction"] == 0.0


def test_sequence_ratio_is_clamped_below_and_above():
    for log_r, want in ((-30.0, -LOG_RATIO_CLAMP), (30.0, LOG_RATIO_CLAMP)):
        new = torch.full((1, 2), log_r, dtype=F64)
        _, m = policy_loss(
            "gspo", new, torch.zeros_like(new), torch.tensor([1.0], dtype=F64), new == new
        )
        assert m["ratio/min"] == pytest.approx(math.exp(want), rel=1e-12)
        assert m["kl/old_new"] == pytest.approx(k3(want), rel=1e-12)


def test_integer_mask_equals_bool_mask():
    new = torch.tensor([[-0.9, -2.1, 0.0], [-0.4, -0.6, -0.5]], dtype=F64)
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    bool_mask = torch.tensor([[True, True, False], [True, True, True]])
    for algo in sorted(LOSSES):
        kw = {} if LOSSES[algo].clip_meaning == "unused" else dict(clip_low=0.2, clip_high=0.2)
        want, m_b = policy_loss(algo, new, old, adv, bool_mask, **kw)
        got, m_i = policy_loss(algo, new, old, adv, bool_mask.long(), **kw)
        assert float(got) == float(want) and m_i == m_b
    with pytest.raises(ValueError, match="only 0 and 1"):
        policy_loss("gspo", new, old, adv, bool_mask.long() * 2)


def test_per_sequence_weights_equal_their_column_and_bad_shapes_fail():
    new = torch.tensor([[-0.9, -2.1, -0.3], [-0.4, -0.6, -0.5]], dtype=F64)  # [2, 3]: B != T
    old = torch.tensor([[-1.0, -2.0, -0.2], [-0.5, -0.5, -0.5]], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    w = torch.tensor([0.5, 2.0], dtype=torch.float32)  # another dtype: cast to the loss's
    kw = dict(clip_low=0.2, clip_high=0.2)
    by_row, _ = policy_loss("grpo", new, old, adv, mask, weights=w, **kw)
    by_token, _ = policy_loss("grpo", new, old, adv, mask, weights=w[:, None].expand(2, 3), **kw)
    assert float(by_row) == pytest.approx(float(by_token), rel=1e-15)
    assert by_row.dtype == F64
    for bad in (torch.ones(3), torch.ones(2, 2), torch.ones(3, 3)):
        with pytest.raises(ValueError, match="weights must be"):
            policy_loss("grpo", new, old, adv, mask, weights=bad, **kw)


def test_argument_checks():
    z = torch.zeros(1, 2, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.ones(1, dtype=F64)
    with pytest.raises(ValueError, match="0 <= clip_low <= 1"):  # 1: no lower bound (CISPO)
        policy_loss("grpo", z, z, adv, mask, clip_low=1.5)
    with pytest.raises(ValueError, match="has no clip range"):
        policy_loss("sapo", z, z, adv, mask, clip_low=0.2)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss("grpo", z, z, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss("grpo", z, z, adv, mask, kl_coef=0.1, ref_logprobs=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="floating point"):
        policy_loss("grpo", z.long(), z.long(), adv, mask)
    with pytest.raises(ValueError, match=r"\[B\]=1 or \[B, T\]=\(1, 2\), got \(3,\)"):
        policy_loss("grpo", z, z, torch.ones(3), mask)
    for bad in (dict(num_sequences=0), dict(num_tokens=0), dict(num_sequences=-1)):
        with pytest.raises(ValueError, match="denominators must be positive"):
            aggregate(z, mask, "token_mean", **bad)
    for constant in (0.0, -1.0, None):
        with pytest.raises(ValueError, match="positive `constant`"):
            aggregate(z, mask, "constant", constant=constant)
    # A constant of 1 (or below the length) is a valid normalizer.
    ones = torch.ones(1, 2, dtype=F64)
    assert float(aggregate(ones[:, :1], mask[:, :1], "token_mean")) == 1.0  # one token: / 1
    assert float(aggregate(ones, mask, "constant", constant=1.0)) == 2.0
    assert float(aggregate(ones, mask, "constant", constant=0.5)) == 4.0
    with pytest.raises(ValueError, match="unknown aggregation 'nope'; valid: seq_mean_token_mean"):
        aggregate(z, mask, "nope")


def test_loss_dtype_follows_the_log_probs():
    """float32 log-probs with float64 advantages or weights give a float32 loss (the
    advantages and weights are cast, not the log-probs promoted)."""
    new = torch.tensor([[-0.9, -2.1], [-0.4, -0.6]], dtype=torch.float32)
    old = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], dtype=torch.float32)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    for algo in sorted(LOSSES):
        loss, _ = policy_loss(algo, new, old, adv, mask)
        assert loss.dtype == torch.float32, algo
    loss, _ = policy_loss("grpo", new, old, adv.float(), mask, weights=torch.ones(2, dtype=F64))
    assert loss.dtype == torch.float32


def test_registered_spec_fields():
    name = "test_spec_fields"

    @register_loss(
        name, clip_low=0.1, clip_high=0.3, aggregations=("token_mean",), token_advantages=True
    )
    def terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
        """Doc line."""
        never = torch.zeros_like(mask)
        return LossTerms(logprobs * 0, never, never, logprobs[:, 0].detach(), mask.any(dim=1))

    try:
        spec = LOSSES[name]
        assert (spec.name, spec.clip_low, spec.clip_high) == (name, 0.1, 0.3)
        assert spec.token_advantages is True and spec.doc == "Doc line."
        assert spec.default_aggregation == "token_mean"
    finally:
        del LOSSES[name]
    with pytest.raises(ValueError, match="unknown aggregation 'x'; valid: seq_mean_token_mean"):
        register_loss("bad", clip_low=0, clip_high=0, aggregations=("x",), token_advantages=False)
    register_loss(
        "test_no_doc", clip_low=0, clip_high=0, aggregations=("token_mean",), token_advantages=False
    )(lambda *args: None)
    try:
        assert LOSSES["test_no_doc"].doc == ""  # no docstring: an empty doc
    finally:
        del LOSSES["test_no_doc"]
