"""Chunked generation (gspo.rollout.chunked, the Ray workers' partial rollouts): each chunk's
tokens carry the log-probs and the version of the weights that made them (float64), and one
chunk covering the whole generation is the engine's own generate."""

from __future__ import annotations

import pytest
import torch

from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import SamplingParams
from gspo.rollout.base import NO_VERSION, GenerationRequest
from gspo.rollout.chunked import ChunkedGeneration
from gspo.rollout.torch_engine import TorchEngine

PROMPT_TEXTS = ["12+3=", "7=", "100-99="]
N = 3
PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0)


def _model(tok, seed: int) -> torch.nn.Module:
    return build_tiny_model(len(tok), hidden_size=32, num_layers=2, seed=seed).double()


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer()
    prompts = [tok(t)["input_ids"] for t in PROMPT_TEXTS]
    return tok, prompts, _model(tok, 11), _model(tok, 12)


def _engine(model) -> TorchEngine:
    return TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, share_weights=False)


def _logprobs(model, r):
    with torch.no_grad():
        out, _ = token_logprobs(
            model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask
        )
    return out  # [N, L]


def test_one_chunk_is_the_engines_generate(setup):
    _, prompts, a, _ = setup
    engine = _engine(a)
    g = ChunkedGeneration(
        engine, GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(5)), 10, PAD_ID
    )
    g.run_chunk(0)
    assert g.done and g.calls == 1
    got = g.result()
    ref = engine.generate(GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(5)))
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.completion_mask, ref.completion_mask)
    assert torch.equal(got.logprobs, ref.logprobs)
    assert got.finish_reasons == ref.finish_reasons
    assert torch.equal(got.prompt_ids, ref.prompt_ids)
    assert bool((got.versions[got.completion_mask.bool()] == 0).all())


def test_chunks_keep_the_logprobs_and_version_of_their_weights(setup):
    """Chunk 0 under weights A (version 0), chunks 1.. under B (version 1): every token's
    recorded log-prob is its own version's policy log-prob (float64), not the other's."""
    _, prompts, a, b = setup
    engine = _engine(a)
    g = ChunkedGeneration(
        engine, GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(2)), 3, PAD_ID
    )
    g.run_chunk(0)
    engine.update_weights(b)
    while not g.done:
        g.run_chunk(1)
    assert g.calls == 4  # 3 + 3 + 3 + 1 tokens
    r = g.result()
    mask = r.completion_mask.bool()  # [N, L]
    v0, v1 = (r.versions == 0) & mask, (r.versions == 1) & mask
    assert bool((r.versions[~mask] == NO_VERSION).all())
    assert int(v0.sum()) and int(v1.sum())  # both versions made tokens
    assert bool(v0[:, :3].eq(mask[:, :3]).all()) and not bool(v0[:, 3:].any())
    la, lb = _logprobs(a, r), _logprobs(b, r)
    err_a = float((la - r.logprobs).abs()[v0].max())
    err_b = float((lb - r.logprobs).abs()[v1].max())
    print(f"chunk log-probs vs their version's policy: {err_a:.1e} (A), {err_b:.1e} (B)")
    assert err_a < 1e-10 and err_b < 1e-10
    assert float((lb - r.logprobs).abs()[v0].max()) > 1e-4  # the check can fail


def test_restart_is_reproducible_and_chunk_generators_differ(setup):
    _, prompts, a, _ = setup
    runs = []
    for _ in range(2):
        g = ChunkedGeneration(
            _engine(a),
            GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(7)),
            4,
            PAD_ID,
        )
        while not g.done:
            g.run_chunk(0)
        runs.append(g.result())
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    with pytest.raises(ValueError, match="async_chunk_tokens"):
        ChunkedGeneration(_engine(a), GenerationRequest(prompts, N, PARAMS, None), 0, PAD_ID)


def test_a_stop_sequence_across_a_chunk_boundary_ends_the_row_there(setup):
    """The engine matches a stop string inside one chunk only; one whose tokens straddle two
    chunks is matched by the generation, which ends the row right after it."""
    _, prompts, a, _ = setup

    def run(stop_seqs=()):
        g = ChunkedGeneration(
            _engine(a),
            GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(3)),
            3,
            PAD_ID,
            stop_seqs,
        )
        while not g.done:
            g.run_chunk(0)
        return g.result()

    free = run()
    lengths = free.completion_mask.sum(dim=1).tolist()  # [N]
    row = next(i for i, n in enumerate(lengths) if n >= 5)
    seq = free.completion_ids[row, 2:4].tolist()  # tokens 2 (chunk 0) and 3 (chunk 1)
    got = run([seq])
    assert got.finish_reasons[row] == "stop"
    assert int(got.completion_mask[row].sum()) == 4
    assert torch.equal(got.completion_ids[row, :4], free.completion_ids[row, :4])
    assert torch.equal(got.logprobs[row, :4], free.logprobs[row, :4])
    for i in range(len(lengths)):  # no row runs on past the sequence across a boundary
        toks = got.completion_ids[i, : int(got.completion_mask[i].sum())].tolist()
        for b in (3, 6, 9):
            assert toks[b - 1 : b + 1] != seq or len(toks) == b + 1


class GenerateOnly:
    """An engine with only the public protocol's ``generate`` (as vLLM or a worker pool): no
    partial generation of its own."""

    def __init__(self, engine: TorchEngine) -> None:
        self.inner, self.pad_id, self.device = engine, engine.pad_id, engine.device

    def generate(self, request):
        return self.inner.generate(request)

    def update_weights(self, model) -> None:
        self.inner.update_weights(model)


def test_partial_generation_through_the_public_protocol(setup):
    """The torch engine gives its own partial generation (equal to generate without a pause);
    an engine with only ``generate`` gets chunks, which stop at the first chunk boundary after
    which new weights are there and continue under them with the next version."""
    from gspo.rollout.base import PartialGeneration, ResumableEngine
    from gspo.rollout.partial import partial_generation

    _, prompts, a, b = setup
    engine = _engine(a)
    assert isinstance(engine, ResumableEngine)
    own = partial_generation(
        engine, GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(5)), chunk=4
    )
    assert not isinstance(own, ChunkedGeneration) and isinstance(own, PartialGeneration)
    own.run(None, 0)
    ref = engine.generate(GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(5)))
    assert torch.equal(own.result().completion_ids, ref.completion_ids)
    assert torch.equal(own.result().logprobs, ref.logprobs)

    plain = GenerateOnly(_engine(a))
    assert not isinstance(plain, ResumableEngine)
    g = partial_generation(
        plain, GenerationRequest(prompts, N, PARAMS, torch.Generator().manual_seed(5)), chunk=4
    )
    assert isinstance(g, ChunkedGeneration)
    assert g.run(None, 0, stop=lambda: True) == 4 and g.calls == 1  # one chunk, then new weights
    g.pause()
    plain.update_weights(b)
    g.run(None, 1)
    r = g.result()
    assert g.done and bool((r.versions[:, :4][r.completion_mask[:, :4].bool()] == 0).all())
    later = r.versions[:, 4:][r.completion_mask[:, 4:].bool()]
    assert later.numel() > 0 and bool((later == 1).all())
