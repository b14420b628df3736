"""The torch engine's compiled decode step (gspo.rollout.compiled_decode): attending over the
whole zero-initialized cache with the unwritten columns masked computes the eager step's function
(float64, not compiled: to 1e-12, on three model families with left-padded prompts), and the
compiled graph gives the eager engine's tokens and log-probs at any row count with one graph
(float32, slow: it compiles)."""

from __future__ import annotations

import pytest
import torch
from test_fast_forward import MODELS

from gspo.models import compiled_forward as cf
from gspo.models.char_tokenizer import EOS_ID, PAD_ID
from gspo.rollout import SamplingParams, compiled_decode
from gspo.rollout.base import GenerationRequest
from gspo.rollout.torch_engine import TorchEngine

PROMPTS = [[5, 9, 14, 3], [7, 8], [11, 12, 13, 14, 15, 16, 17], [20]]  # ragged: left padding


def test_cache_width_steps():
    assert [compiled_decode.cache_width(n) for n in (1, 16, 17, 33)] == [16, 16, 32, 48]


def _generate(model, compiled: bool, n: int, seed: int, temperature=0.8, prompts=PROMPTS):
    engine = TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, compiled=compiled)
    params = SamplingParams(max_new_tokens=11, temperature=temperature)
    return engine.generate(
        GenerationRequest(prompts, n, params, torch.Generator().manual_seed(seed))
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_masked_whole_cache_step_equals_eager_float64(name, monkeypatch):
    """The compiled path's functions run eagerly (no inductor): same tokens, log-probs to 1e-12."""
    monkeypatch.setattr(compiled_decode, "_compiled", lambda: compiled_decode.decode_step)
    monkeypatch.setattr(compiled_decode, "_compiled_prefill", lambda: compiled_decode._prefill)
    model = MODELS[name]().double()
    a, b = _generate(model, False, 3, 4), _generate(model, True, 3, 4)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert a.finish_reasons == b.finish_reasons
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-12, rtol=0)


@pytest.mark.slow
def test_compiled_decode_equals_eager_float32(monkeypatch):
    """Compiled (decode steps and prefill): greedy tokens equal eager's and sampled log-probs
    within 1e-5; generations of 12 and 20 rows run one decode graph (rows are dynamic), and other
    prompt counts and widths the same prefill graph. (~1 min: inductor.)"""
    monkeypatch.setattr(cf, "RECORD", cf.CompileRecord())
    model = MODELS["qwen3"]()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    greedy = [_generate(model, c, 3, 0, temperature=0.0) for c in (False, True)]
    assert torch.equal(greedy[0].completion_ids, greedy[1].completion_ids)
    torch.testing.assert_close(greedy[1].logprobs, greedy[0].logprobs, atol=1e-5, rtol=0)
    a, b = _generate(model, False, 5, 1), _generate(model, True, 5, 1)
    same = (a.completion_ids == b.completion_ids).all(dim=1)  # [N] rows sampled alike
    assert same.float().mean() > 0.9  # a near-tie may flip a draw; the rest agree
    torch.testing.assert_close(b.logprobs[same], a.logprobs[same], atol=1e-5, rtol=0)
    # prompt 7 + 11 new -> 32 columns
    assert cf.RECORD.keys == {("decode", 32, torch.float32), ("prefill", torch.float32)}
    assert cf.RECORD.first_call_s > 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 2
    # 2 prompts 4 wide (not 4 prompts 7 wide): the same prefill graph, a 16-column decode graph
    a, b = (_generate(model, c, 3, 0, temperature=0.0, prompts=PROMPTS[:2]) for c in (False, True))
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=0)
    assert ("decode", 16, torch.float32) in cf.RECORD.keys
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 3
