"""Partial rollouts (gspo.rollout.partial): a generation paused at a token position and continued
under new weights equals one made by an engine whose weights are switched at that position, and
each token keeps the log-prob and the version of the weights that produced it (float64)."""

from __future__ import annotations

import pytest
import torch

from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.logprobs import positions_from_mask, token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import SamplingParams
from gspo.rollout.base import NO_VERSION, GenerationRequest
from gspo.rollout.partial import sample_versions
from gspo.rollout.torch_decode import FastDecoder, ResumableGeneration, sample_next
from gspo.rollout.torch_engine import TorchEngine

PROMPT_TEXTS = ["12+3=", "7=", "100-99="]
N = 3  # samples per prompt
PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


def _model(tok, seed: int) -> torch.nn.Module:
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=2, seed=seed).double()
    # A larger EOS logit along the mean final hidden state, so rows end at different lengths
    # (a weight change, not a hook: hooks would turn the fast decoder off).
    with torch.no_grad():
        ids = torch.randint(3, 50, (8, 10), generator=torch.Generator().manual_seed(0))
        h = m.model(input_ids=ids).last_hidden_state  # [8, 10, H] after the final norm
        mu = h.reshape(-1, h.shape[-1]).mean(dim=0)  # [H]
        m.lm_head.weight[EOS_ID] += 2.0 * mu / mu.norm() ** 2
    return m


@pytest.fixture(scope="module")
def models(tok):
    return _model(tok, 11), _model(tok, 12)


def _engine(model, fast: bool = True) -> TorchEngine:
    assert not fast or FastDecoder.supports(model)  # fast=True really takes the fast path
    return TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, share_weights=False, fast=fast)


def _reference(models, prompts, switch_at: int, seed: int):
    """An independent sampler: a full forward (no cache) per token, weights models[0] before
    position ``switch_at`` and models[1] from it on, the same random draws as the engine."""
    gen = torch.Generator().manual_seed(seed)
    rows = [p for p in prompts for _ in range(N)]
    width = max(len(p) for p in rows)
    ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in rows])  # [N, P]
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in rows])[:, None]).long()
    done = torch.zeros(len(rows), dtype=torch.bool)  # [N]
    toks, lps = [], []
    for t in range(PARAMS.max_new_tokens):
        model = models[0] if t < switch_at else models[1]
        with torch.no_grad():
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)
            ).logits[:, -1]  # [N, V]
        tok, lp = sample_next(logits, PARAMS.temperature, PARAMS.top_p, gen)
        tok = tok.masked_fill(done, PAD_ID)
        toks.append(tok)
        lps.append(lp.masked_fill(done, 0.0))
        done = done | (tok == EOS_ID)
        ids = torch.cat([ids, tok[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(tok)[:, None]], dim=1)
        if bool(done.all()):
            break
    return torch.stack(toks, dim=1), torch.stack(lps, dim=1)  # [N, T], [N, T]


def _paused(models, prompts, switch_at: int, seed: int, fast: bool = True):
    engine = _engine(models[0], fast=fast)
    g = ResumableGeneration(
        engine, GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(seed))
    )
    assert g.run(switch_at, version=0) == switch_at
    g.pause()
    engine.update_weights(models[1])
    g.run(None, version=1)
    assert g.done
    return g.result()


@pytest.mark.slow
def test_uninterrupted_equals_engine_generate_bitwise(models, prompts):
    engine = _engine(models[0])
    ref = engine.generate(GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(5)))
    g = ResumableGeneration(
        engine, GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(5))
    )
    while not g.done:
        g.run(3, version=7)  # chunks without a weight change keep the live cache
    r = g.result()
    assert g.pauses == 0
    assert torch.equal(r.completion_ids, ref.completion_ids)
    assert torch.equal(r.completion_mask, ref.completion_mask)
    assert torch.equal(r.logprobs, ref.logprobs)
    assert r.finish_reasons == ref.finish_reasons
    assert torch.equal(r.versions, torch.where(r.completion_mask.bool(), 7, NO_VERSION))


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("switch_at", [1, 4])
def test_continued_equals_weights_switched_at_same_position(models, prompts, switch_at, fast):
    seed = 3
    r = _paused(models, prompts, switch_at, seed, fast=fast)
    ref_tok, ref_lp = _reference(models, prompts, switch_at, seed)
    length = r.completion_ids.shape[1]
    assert length > switch_at  # the switch happened inside the generation
    assert torch.equal(r.completion_ids, ref_tok[:, :length])
    assert (ref_tok[:, length:] == PAD_ID).all()
    torch.testing.assert_close(r.logprobs, ref_lp[:, :length], rtol=0, atol=1e-10)
    lengths = r.completion_mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 2  # rows of different lengths were exercised


@pytest.mark.slow
def test_each_token_keeps_the_logprob_and_version_of_its_engine(models, prompts):
    switch_at = 4
    r = _paused(models, prompts, switch_at, seed=9)
    m = r.completion_mask.bool()  # [N, L]
    first = torch.arange(r.completion_ids.shape[1]) < switch_at  # [L]
    expected = torch.where(first, 0, 1).expand_as(m)  # [N, L]
    assert torch.equal(r.versions, torch.where(m, expected, NO_VERSION))
    for version, model in enumerate(models):
        with torch.no_grad():
            lp, _ = token_logprobs(
                model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask
            )  # [N, L]
        mine = m & (r.versions == version)
        assert mine.any()
        torch.testing.assert_close(r.logprobs[mine], lp[mine], rtol=0, atol=1e-10)
        # ...and not those of the other engine (the weights differ enough to tell).
        assert (r.logprobs[m & ~mine] - lp[m & ~mine]).abs().max() > 1e-3
    oldest, newest = sample_versions(r)
    long_rows = r.completion_mask.sum(dim=1) > switch_at
    assert torch.equal(oldest, torch.zeros_like(oldest))
    assert torch.equal(newest, long_rows.long())


def test_pause_under_same_weights_changes_no_token(models, prompts):
    engine = _engine(models[0])
    ref = engine.generate(GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(1)))
    g = ResumableGeneration(
        engine, GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(1))
    )
    g.run(2, version=0)
    g.run(3, version=1)  # a new version re-prefills even without an explicit pause
    g.pause()
    g.run(None, version=1)
    r = g.result()
    assert g.pauses == 2
    assert torch.equal(r.completion_ids, ref.completion_ids)
    torch.testing.assert_close(r.logprobs, ref.logprobs, rtol=0, atol=1e-10)


def test_result_before_done_is_an_error(models, prompts):
    g = ResumableGeneration(_engine(models[0]), GenerationRequest(prompts, N, PARAMS))
    g.run(1, version=0)
    with pytest.raises(RuntimeError, match="not finished"):
        g.result()
    with pytest.raises(ValueError, match="n must be"):
        ResumableGeneration(_engine(models[0]), GenerationRequest(prompts, 0, PARAMS))


def test_stop_callback_pauses_after_the_token_it_fires_on(models, prompts):
    g = ResumableGeneration(_engine(models[0]), GenerationRequest(prompts, N, PARAMS))
    calls = []

    def stop() -> bool:
        calls.append(g.position)
        return len(calls) == 3

    assert g.run(None, version=0, stop=stop) == 3
    assert g.position == 3 and not g.done
