"""Tests for gspo.rollout.torch_engine.TorchEngine: layout, log-prob convention, stopping, sampling controls,
weight sharing and copies."""

from __future__ import annotations

import pytest
import rollout_support
import torch
from rollout_support import _engine, _rescore

from gspo.models.char_tokenizer import EOS_ID, PAD_ID
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import Rollout, RolloutEngine, SamplingParams
from gspo.rollout.base import GenerationRequest

# Fixtures shared with the other files split from test_rollout.py.
model64 = rollout_support.model64
prompts = rollout_support.prompts
tok = rollout_support.tok


class EosBias:
    """Forward hook on lm_head adding a constant to the EOS logit, so completions end at
    random lengths. It is part of the model, so engine and token_logprobs both see it."""

    def __init__(self, model, bias: float) -> None:
        self.bias = bias
        self.handle = model.lm_head.register_forward_hook(self)

    def __call__(self, module, args, out):
        out = out.clone()
        out[..., EOS_ID] += self.bias
        return out

    def remove(self) -> None:
        self.handle.remove()


def _check_layout(r: Rollout, prompts, n: int, params: SamplingParams) -> None:
    num = len(prompts) * n
    width = max(len(p) for p in prompts)
    assert r.num_samples == num
    assert r.prompt_ids.shape == (num, width) == r.prompt_mask.shape
    assert r.prompt_index.tolist() == [i for i in range(len(prompts)) for _ in range(n)]
    for row in range(num):
        p = prompts[row // n]
        assert r.prompt_ids[row, width - len(p) :].tolist() == p  # left-padded
        assert r.prompt_mask[row].tolist() == [0] * (width - len(p)) + [1] * len(p)
        assert (r.prompt_ids[row, : width - len(p)] == PAD_ID).all()
    lengths = r.completion_lengths()
    assert r.completion_ids.shape == r.completion_mask.shape == r.logprobs.shape
    assert r.completion_ids.shape[1] == int(lengths.max())  # trimmed to the longest
    assert len(r.finish_reasons) == num
    for row in range(num):
        k = int(lengths[row])
        assert r.completion_mask[row].tolist() == [1] * k + [0] * (r.completion_ids.shape[1] - k)
        assert (r.completion_ids[row, k:] == PAD_ID).all()
        assert (r.logprobs[row, k:] == 0).all()
        assert (r.logprobs[row, :k] < 0).all()
        if r.finish_reasons[row] == "length":
            assert k == params.max_new_tokens
        else:
            assert r.finish_reasons[row] == "stop"


def test_engine_satisfies_protocol(model64):
    assert isinstance(_engine(model64), RolloutEngine)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_token_logprobs_float64(model64, prompts, temperature):
    eng = _engine(model64)
    params = SamplingParams(max_new_tokens=10, temperature=temperature)
    g = torch.Generator().manual_seed(0)
    r = eng.generate(GenerationRequest(prompts, 3, params, generator=g))
    _check_layout(r, prompts, 3, params)
    assert r.logprobs.dtype == torch.float64
    torch.testing.assert_close(r.logprobs, _rescore(model64, r, temperature), atol=1e-9, rtol=0)


def test_logprobs_match_token_logprobs_float32(tok, prompts):
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=2, seed=4)
    params = SamplingParams(max_new_tokens=12, temperature=0.8)
    r = _engine(m).generate(
        GenerationRequest(prompts, 2, params, generator=torch.Generator().manual_seed(1))
    )
    assert r.logprobs.dtype == torch.float32
    torch.testing.assert_close(r.logprobs, _rescore(m, r, 0.8), atol=1e-5, rtol=0)


def test_eos_finishes_rows_and_pads(model64, prompts):
    # A bias giving EOS roughly a coin-flip chance per step: rows end at mixed lengths.
    hook = EosBias(model64, bias=4.5)
    try:
        params = SamplingParams(max_new_tokens=8, temperature=1.0)
        r = _engine(model64).generate(
            GenerationRequest(prompts, 4, params, generator=torch.Generator().manual_seed(2))
        )
        _check_layout(r, prompts, 4, params)
        lengths = r.completion_lengths()
        stops = [i for i, f in enumerate(r.finish_reasons) if f == "stop"]
        assert stops and len(set(lengths.tolist())) > 1  # some stop, at different lengths
        for row in range(r.num_samples):
            k = int(lengths[row])
            ids = r.completion_ids[row, :k].tolist()
            if r.finish_reasons[row] == "stop":
                assert ids[-1] == EOS_ID  # the stop token is kept, with mask 1
                assert EOS_ID not in ids[:-1]  # and nothing was generated past the first one
            else:
                assert EOS_ID not in ids
        torch.testing.assert_close(r.logprobs, _rescore(model64, r, 1.0), atol=1e-9, rtol=0)
    finally:
        hook.remove()


def test_early_exit_when_all_rows_stop(model64, prompts):
    hook = EosBias(model64, bias=1e3)  # EOS is certain at the first step
    try:
        params = SamplingParams(max_new_tokens=20)
        r = _engine(model64).generate(GenerationRequest(prompts, 2, params))
        assert r.completion_ids.shape[1] == 1
        assert (r.completion_ids[:, 0] == EOS_ID).all()
        assert r.finish_reasons == ["stop"] * r.num_samples
    finally:
        hook.remove()


@pytest.mark.slow
def test_max_new_tokens_gives_length(model64, prompts):
    hook = EosBias(model64, bias=-1e3)  # EOS never drawn: every row runs to the cap
    try:
        params = SamplingParams(max_new_tokens=5, temperature=1.0)
        r = _engine(model64).generate(
            GenerationRequest(prompts, 2, params, torch.Generator().manual_seed(3))
        )
    finally:
        hook.remove()
    assert r.finish_reasons == ["length"] * r.num_samples
    assert r.completion_ids.shape == (r.num_samples, 5)
    assert (r.completion_mask == 1).all()
    _check_layout(r, prompts, 2, params)
    r0 = _engine(model64).generate(GenerationRequest(prompts, 1, SamplingParams(max_new_tokens=0)))
    assert r0.completion_ids.shape == (len(prompts), 0) == r0.logprobs.shape
    assert r0.finish_reasons == ["length"] * len(prompts)


def test_stop_token_ids(model64, prompts):
    # Take a token greedy decoding emits mid-way and make it a stop token.
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    eng = _engine(model64)
    ref = eng.generate(GenerationRequest(prompts, 1, greedy))
    stop_tok = int(ref.completion_ids[0, 2])
    r = eng.generate(
        GenerationRequest(
            prompts,
            1,
            SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(stop_tok,)),
        )
    )
    for row in range(r.num_samples):
        full = ref.completion_ids[row].tolist()
        ids = r.completion_ids[row, : int(r.completion_lengths()[row])].tolist()
        if stop_tok in full:
            assert ids == full[: full.index(stop_tok) + 1]
            assert r.finish_reasons[row] == "stop"
        else:
            assert ids == full and r.finish_reasons[row] == "length"
    assert r.finish_reasons[0] == "stop"


def _find(seq: list[int], sub: list[int]) -> int:
    """Index of the first occurrence of ``sub`` in ``seq`` (-1 if absent)."""
    return next((i for i in range(len(seq) - len(sub) + 1) if seq[i : i + len(sub)] == sub), -1)


@pytest.mark.slow
def test_stop_strings(tok, model64, prompts):
    eng = _engine(model64, tok)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    base = eng.generate(
        GenerationRequest(prompts, 4, params, generator=torch.Generator().manual_seed(5))
    )
    # A random model also samples special tokens; take the first bigram of plain characters
    # in row 0 as the stop string, so it is surely hit there.
    row0 = base.completion_ids[0].tolist()
    j = next(i for i in range(len(row0) - 1) if min(row0[i : i + 2]) > EOS_ID)
    stop = tok.decode(row0[j : j + 2])
    stop_ids = tok(stop, add_special_tokens=False)["input_ids"]
    assert len(stop) == 2 and stop_ids == row0[j : j + 2]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop_strings=(stop,))
    r = eng.generate(
        GenerationRequest(prompts, 4, params, generator=torch.Generator().manual_seed(5))
    )
    _check_layout(r, prompts, 4, params)
    # The same seed draws the same tokens up to the stop point.
    assert r.completion_ids[0, : int(r.completion_lengths()[0])].tolist() == row0[: j + 2]
    assert r.finish_reasons[0] == "stop"
    for row in range(r.num_samples):
        ids = r.completion_ids[row, : int(r.completion_lengths()[row])].tolist()
        if r.finish_reasons[row] == "stop":
            at = _find(ids, stop_ids)
            assert at == len(ids) - 2 or ids[-1] == EOS_ID
            if ids[-1] != EOS_ID:
                assert tok.decode(ids).endswith(stop)
        else:
            assert _find(ids, stop_ids) == -1
    torch.testing.assert_close(r.logprobs, _rescore(model64, r, 1.0), atol=1e-9, rtol=0)


def test_another_dtype_is_a_copy_even_when_sharing_is_allowed(model64):
    eng = _engine(model64, dtype=torch.float32)  # share_weights=True, but not the same dtype
    assert not eng.shares_weights and eng.model is not model64
    assert next(eng.model.parameters()).dtype == torch.float32


def test_eos_still_stops_rows_when_stop_strings_are_set(tok, model64, prompts):
    # Stop strings are checked after the stop tokens; they must add to those hits, not replace
    # them: with a stop string that never appears, EOS still ends every row at once.
    hook = EosBias(model64, bias=1e3)
    try:
        params = SamplingParams(max_new_tokens=6, temperature=1.0, stop_strings=("~",))
        r = _engine(model64, tok).generate(
            GenerationRequest(prompts, 2, params, torch.Generator().manual_seed(0))
        )
    finally:
        hook.handle.remove()
    assert r.finish_reasons == ["stop"] * r.num_samples
    assert r.completion_lengths().tolist() == [1] * r.num_samples


def test_stop_strings_need_tokenizer(model64, prompts):
    with pytest.raises(ValueError, match="tokenizer"):
        _engine(model64).generate(
            GenerationRequest(prompts, 1, SamplingParams(stop_strings=("x",)))
        )


def test_shared_weights_follow_the_trainer(tok, prompts):
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=6).double()
    m.train()
    eng = _engine(m)
    assert eng.shares_weights and eng.model is m
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = eng.generate(GenerationRequest(prompts, 1, params))
    assert m.training  # training mode restored
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    eng.update_weights(m)  # no-op for shared weights
    after = eng.generate(GenerationRequest(prompts, 1, params))
    assert not torch.equal(before.logprobs, after.logprobs)
    m.eval()
    torch.testing.assert_close(after.logprobs, _rescore(m, after, 1.0), atol=1e-9, rtol=0)


def test_rollout_tensors_usable_with_autograd(tok, prompts):
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=8)
    m.train()
    r = _engine(m).generate(
        GenerationRequest(
            prompts, 2, SamplingParams(max_new_tokens=5), torch.Generator().manual_seed(0)
        )
    )
    assert not any(
        t.is_inference()
        for t in (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.logprobs)
    )
    lp, _ = token_logprobs(m, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    ratio = torch.exp(lp - r.logprobs) * r.completion_mask  # [N, L]
    (ratio.sum() * r.logprobs.mean()).backward()
    assert m.model.embed_tokens.weight.grad is not None


@pytest.mark.slow
def test_bf16_copy_is_close_but_not_equal_and_updates(tok, prompts):
    m = build_tiny_model(len(tok), hidden_size=64, num_layers=2, seed=9)
    eng = _engine(m, dtype=torch.bfloat16, share_weights=False)
    assert not eng.shares_weights and eng.model is not m
    assert eng.model.lm_head.weight.dtype == torch.bfloat16
    assert m.lm_head.weight.dtype == torch.float32  # the trainer's model is untouched
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    r = eng.generate(
        GenerationRequest(prompts, 3, params, generator=torch.Generator().manual_seed(0))
    )
    assert r.logprobs.dtype == torch.float32
    ref = _rescore(m, r, 1.0)  # [N, L] float32 trainer log-probs of the bf16 samples
    diff = (r.logprobs - ref).abs()[r.completion_mask.bool()]
    assert diff.max() > 1e-6  # precision mismatch is visible ...
    assert diff.max() < 0.2  # ... but small

    # Trainer step: the copy is stale until update_weights.
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1.5)
    stale = eng.model.lm_head.weight.float()
    assert not torch.allclose(stale, m.lm_head.weight)
    eng.update_weights(m)
    for name, p in eng.model.state_dict().items():
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, m.state_dict()[name].to(torch.bfloat16)), name
    assert eng.model.lm_head.weight.data_ptr() == eng.model.model.embed_tokens.weight.data_ptr()
    r2 = eng.generate(
        GenerationRequest(prompts, 3, params, generator=torch.Generator().manual_seed(0))
    )
    diff2 = (r2.logprobs - _rescore(m, r2, 1.0)).abs()[r2.completion_mask.bool()]
    assert diff2.max() < 0.2


def test_float32_copy_matches_exactly_after_update(tok, prompts):
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=10).double()
    eng = _engine(m, share_weights=False)
    assert not eng.shares_weights
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1)
    eng.update_weights(m)
    r = eng.generate(
        GenerationRequest(
            prompts, 2, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0)
        )
    )
    torch.testing.assert_close(r.logprobs, _rescore(m, r, 1.0), atol=1e-9, rtol=0)


def test_invalid_arguments(model64, prompts):
    eng = _engine(model64)
    with pytest.raises(ValueError):
        eng.generate(GenerationRequest([[]], 1, SamplingParams()))
    with pytest.raises(ValueError):
        eng.generate(GenerationRequest(prompts, 0, SamplingParams()))
    with pytest.raises(ValueError):
        eng.generate(GenerationRequest(prompts, 1, SamplingParams(top_p=0.0)))
    with pytest.raises(ValueError):
        eng.generate(GenerationRequest(prompts, 1, SamplingParams(temperature=-1.0)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engine(tok, prompts):
    m = build_tiny_model(len(tok), hidden_size=64, num_layers=2, seed=12).cuda()
    eng = _engine(m, tok, device="cuda")
    assert eng.shares_weights and eng.model is m
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, stop_strings=("==",))
    r = eng.generate(
        GenerationRequest(
            prompts, 4, params, generator=torch.Generator(device="cuda").manual_seed(0)
        )
    )
    assert r.completion_ids.is_cuda and r.logprobs.is_cuda
    _check_layout(r, prompts, 4, params)
    torch.testing.assert_close(r.logprobs, _rescore(m, r, 0.9), atol=1e-4, rtol=0)
    # A CPU generator with a CUDA model: sampling is drawn on CPU, still reproducible.
    a = eng.generate(
        GenerationRequest(prompts, 2, params, generator=torch.Generator().manual_seed(1))
    )
    b = eng.generate(
        GenerationRequest(prompts, 2, params, generator=torch.Generator().manual_seed(1))
    )
    assert torch.equal(a.completion_ids, b.completion_ids)
    # bf16 copy on the same GPU, refreshed by update_weights.
    eng16 = _engine(m, dtype=torch.bfloat16, share_weights=False)
    with torch.no_grad():
        m.lm_head.weight.mul_(2.0)
    eng16.update_weights(m)
    assert torch.equal(eng16.model.lm_head.weight, m.lm_head.weight.to(torch.bfloat16))
    r16 = eng16.generate(
        GenerationRequest(prompts, 2, params, generator=torch.Generator().manual_seed(1))
    )
    diff = (r16.logprobs - _rescore(m, r16, 0.9)).abs()[r16.completion_mask.bool()]
    assert diff.max() < 0.2
