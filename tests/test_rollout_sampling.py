"""Sampling controls of gspo.rollout.torch_engine.TorchEngine: greedy decoding is deterministic and matches
a manual argmax, the same seed gives the same samples, a tiny top_p equals greedy, and the
inverse-CDF sampler and sample_next follow the softmax (hand-computed, tail mass, top_p support
and log-probs).
"""

from __future__ import annotations

import pytest
import rollout_support
import torch
from rollout_support import _engine, _rescore

from gspo.models.char_tokenizer import EOS_ID
from gspo.rollout import SamplingParams
from gspo.rollout.base import GenerationRequest
from gspo.rollout.torch_decode import inverse_cdf_sample, sample_next

# Fixtures shared with the other files split from test_rollout.py.
model64 = rollout_support.model64
prompts = rollout_support.prompts
tok = rollout_support.tok


@pytest.mark.slow
def test_greedy_is_deterministic_and_matches_manual_argmax(model64, prompts):
    eng = _engine(model64)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    a = eng.generate(
        GenerationRequest(prompts, 1, params, generator=torch.Generator().manual_seed(0))
    )
    b = eng.generate(
        GenerationRequest(prompts, 1, params, generator=torch.Generator().manual_seed(99))
    )
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.logprobs, b.logprobs)
    with torch.no_grad():
        for row, p in enumerate(prompts):
            x = torch.tensor([p])  # [1, P] no padding, no cache
            out = []
            for _ in range(8):
                nxt = int(model64(x).logits[0, -1].argmax())
                out.append(nxt)
                x = torch.cat([x, torch.tensor([[nxt]])], 1)
                if nxt == EOS_ID:
                    break
            k = int(a.completion_lengths()[row])
            assert a.completion_ids[row, :k].tolist() == out
    # Greedy log-probs are of the T=1 distribution.
    torch.testing.assert_close(a.logprobs, _rescore(model64, a, 1.0), atol=1e-9, rtol=0)


@pytest.mark.slow
def test_same_seed_same_samples(model64, prompts):
    eng = _engine(model64)
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    a = eng.generate(
        GenerationRequest(prompts, 3, params, generator=torch.Generator().manual_seed(42))
    )
    b = eng.generate(
        GenerationRequest(prompts, 3, params, generator=torch.Generator().manual_seed(42))
    )
    c = eng.generate(
        GenerationRequest(prompts, 3, params, generator=torch.Generator().manual_seed(43))
    )
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # Samples within a group differ (n copies of the same prompt are sampled independently).
    assert not torch.equal(a.completion_ids[0], a.completion_ids[1])


@pytest.mark.slow
def test_tiny_top_p_equals_greedy(model64, prompts):
    eng = _engine(model64)
    greedy = eng.generate(
        GenerationRequest(prompts, 2, SamplingParams(max_new_tokens=8, temperature=0.0))
    )
    nucleus = eng.generate(
        GenerationRequest(
            prompts,
            2,
            SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1e-6),
            generator=torch.Generator().manual_seed(0),
        ),
    )
    assert torch.equal(greedy.completion_ids, nucleus.completion_ids)
    # Top-p does not change the recorded log-prob (untruncated T=1 distribution here).
    torch.testing.assert_close(greedy.logprobs, nucleus.logprobs, atol=1e-12, rtol=0)


def test_inverse_cdf_sample_hand_computed():
    # Dyadic masses, so every cumulative boundary is exact: cdf = [0.5, 0.5, 0.75, 1.0].
    probs = torch.tensor([0.5, 0.0, 0.25, 0.25])
    u = torch.tensor([0.0, 0.4999, 0.5, 0.7499, 0.75, 0.9999], dtype=torch.float64)
    want = torch.tensor([0, 0, 2, 2, 3, 3])
    rows = probs.repeat(len(u), 1)  # [6, 4]
    assert torch.equal(inverse_cdf_sample(rows, u), want)
    # Unnormalised rows give the same draws (the uniform is scaled by the row's total).
    assert torch.equal(inverse_cdf_sample(rows * 4.0, u), want)
    # A leading zero-mass token is never drawn, even at u = 0.
    assert inverse_cdf_sample(torch.tensor([[0.0, 0.0, 1.0]]), torch.zeros(1)).item() == 2
    # u * total rounding up to the total lands on the last token with mass, not on the
    # zero-mass tail (nor one past the end).
    tail = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    assert inverse_cdf_sample(tail, torch.ones(1, dtype=torch.float64)).item() == 1


def test_inverse_cdf_sample_keeps_tiny_tail_mass():
    # A 1e-12 token between two 0.5 tokens: in a float32 running sum 0.5 + 1e-12 == 0.5, so it
    # could never be drawn. The float64 cumulative sum keeps its own interval.
    probs = torch.tensor([[0.5, 1e-12, 0.5]], dtype=torch.float32)
    total = probs.double().sum()
    inside = (0.5 + 0.5 * float(probs[0, 1])) / total  # lands inside the tiny token's interval
    assert inverse_cdf_sample(probs, inside.reshape(1)).item() == 1


def test_sample_next_frequencies_follow_softmax():
    # 100k draws over 50 tokens: a chi-square statistic with 49 degrees of freedom has mean 49
    # and sd 10; 110 is a 1e-6 tail, so only a biased sampler fails.
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(50, generator=g, dtype=torch.float64) * 1.5  # [V]
    n = 100_000
    tokens, lp = sample_next(logits.repeat(n, 1), 1.0, 1.0, g)
    p = torch.softmax(logits, -1)
    counts = torch.bincount(tokens, minlength=50).double()
    chi2 = ((counts - n * p) ** 2 / (n * p)).sum().item()
    assert chi2 < 110, chi2
    torch.testing.assert_close(lp, p.log()[tokens], atol=1e-12, rtol=0)


def test_sample_next_top_p_support_and_logprobs():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = probs.log().repeat(4000, 1)  # [4000, 4]
    g = torch.Generator().manual_seed(0)
    for top_p, support in [
        (0.5, {0}),
        (0.6, {0, 1}),
        (0.8, {0, 1}),
        (0.81, {0, 1, 2}),
        (1.0, {0, 1, 2, 3}),
    ]:
        tokens, lp = sample_next(logits, 1.0, top_p, g)
        assert set(tokens.tolist()) == support
        torch.testing.assert_close(lp, probs.log()[tokens], atol=1e-12, rtol=0)
    # Temperature scales the recorded log-prob; frequencies follow the nucleus-renormalised mass.
    tokens, lp = sample_next(logits, 0.5, 1.0, g)
    sharp = torch.log_softmax(probs.log() / 0.5, -1)
    torch.testing.assert_close(lp, sharp[tokens], atol=1e-12, rtol=0)
    freq = torch.bincount(tokens, minlength=4).double() / tokens.numel()
    torch.testing.assert_close(freq, sharp.exp(), atol=0.03, rtol=0)
    tokens, lp = sample_next(logits, 0.0, 1.0, g)
    assert (tokens == 0).all()
    torch.testing.assert_close(lp, probs.log()[tokens], atol=1e-12, rtol=0)
