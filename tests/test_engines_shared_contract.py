"""One rollout contract, run against every engine (torch, vLLM): layout and padding, stop tokens,
EOS, stop strings, masks, finish reasons, seeds, greedy, and log-probs by the project's
convention (log softmax(logits / T) before top-p), all with the same meaning."""

from __future__ import annotations

import importlib

import pytest
import torch
from vllm_support import LOGPROB_TOL, needs_vllm, vllm_engine

from gspo.config.options import ROLLOUT_ENGINES
from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import Rollout, RolloutEngine, SamplingParams
from gspo.rollout.base import GenerationRequest
from gspo.rollout.torch_engine import TorchEngine

PROMPT_TEXTS = ["12+3=", "7=", "100-99=", "ab cd"]
ENGINES = ["torch", pytest.param("vllm", marks=[needs_vllm, pytest.mark.slow])]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    # head size 128 / 4 = 32: the smallest vLLM's CPU attention runs.
    return build_tiny_model(len(tok), hidden_size=128, num_layers=2, num_heads=4, seed=3)


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="module")
def engines(model, tok):
    made: dict = {}

    def get(name: str):
        if name not in made:
            if name == "torch":
                made[name] = TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, tokenizer=tok)
            else:
                made[name] = vllm_engine(model, tok)
        return made[name]

    yield get
    for engine in made.values():
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def _rescore(model, r: Rollout, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = token_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.completion_ids,
            r.completion_mask,
            temperature=temperature,
        )
    return lp  # [N, L]


def check_contract(r: Rollout, prompts, n: int, params: SamplingParams, stops: set[int]) -> None:
    """Everything a Rollout promises, row by row."""
    num, width = len(prompts) * n, max(len(p) for p in prompts)
    assert r.num_samples == num and len(r.finish_reasons) == num
    assert r.prompt_ids.shape == r.prompt_mask.shape == (num, width)
    assert r.prompt_index.tolist() == [i for i in range(len(prompts)) for _ in range(n)]
    lengths = r.completion_lengths()  # [N]
    assert r.completion_ids.shape == r.completion_mask.shape == r.logprobs.shape
    assert r.completion_ids.shape[1] == (int(lengths.max()) if num else 0)
    assert r.logprobs.dtype == torch.float32
    for row in range(num):
        p = prompts[row // n]
        assert r.prompt_ids[row, width - len(p) :].tolist() == p  # left-padded prompt
        assert r.prompt_mask[row].tolist() == [0] * (width - len(p)) + [1] * len(p)
        assert (r.prompt_ids[row, : width - len(p)] == PAD_ID).all()
        k = int(lengths[row])
        ids = r.completion_ids[row, :k].tolist()
        assert r.completion_mask[row].tolist() == [1] * k + [0] * (r.completion_ids.shape[1] - k)
        assert (r.completion_ids[row, k:] == PAD_ID).all()  # right-padded completion
        assert (r.logprobs[row, k:] == 0).all()
        assert torch.isfinite(r.logprobs[row, :k]).all() and (r.logprobs[row, :k] <= 0).all()
        assert not any(t in stops for t in ids[:-1])  # a stop token ends the row ...
        if r.finish_reasons[row] == "stop":
            assert k >= 1 and ids[-1] in stops  # ... and stays in it, inside the mask
        else:
            assert r.finish_reasons[row] == "length"
            assert k == params.max_new_tokens and (k == 0 or ids[-1] not in stops)


@pytest.mark.parametrize("name", ENGINES)
def test_engine_satisfies_protocol(engines, name):
    assert isinstance(engines(name), RolloutEngine)


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stop_tokens_eos_masks_and_logprobs(engines, model, tok, prompts, name, temperature):
    stop_ids = tuple(tok(c, add_special_tokens=False)["input_ids"][0] for c in "0123456789")
    params = SamplingParams(max_new_tokens=8, temperature=temperature, stop_token_ids=stop_ids)
    r = engines(name).generate(
        GenerationRequest(prompts, 6, params, torch.Generator().manual_seed(1))
    )
    check_contract(r, prompts, 6, params, {EOS_ID, *stop_ids})
    reasons = set(r.finish_reasons)
    assert reasons == {"stop", "length"}, reasons  # both paths exercised
    diff = (_rescore(model, r, temperature) - r.logprobs).abs().max()
    assert float(diff) <= LOGPROB_TOL, float(diff)


@pytest.mark.parametrize("name", ENGINES)
def test_stop_strings_end_rows_like_stop_tokens(engines, tok, prompts, name):
    params = SamplingParams(max_new_tokens=10, temperature=1.0, stop_strings=("7", "a"))
    r = engines(name).generate(
        GenerationRequest(prompts, 6, params, torch.Generator().manual_seed(2))
    )
    stops = {EOS_ID, *tok("7a", add_special_tokens=False)["input_ids"]}
    check_contract(r, prompts, 6, params, stops)


@pytest.mark.parametrize("name", ENGINES)
def test_zero_new_tokens(engines, prompts, name):
    params = SamplingParams(max_new_tokens=0)
    r = engines(name).generate(
        GenerationRequest(prompts, 2, params, torch.Generator().manual_seed(0))
    )
    check_contract(r, prompts, 2, params, {EOS_ID})
    assert r.completion_ids.shape == (len(prompts) * 2, 0)
    assert r.finish_reasons == ["length"] * len(prompts) * 2


@pytest.mark.parametrize("name", ENGINES)
def test_same_seed_same_samples_other_seed_differs(engines, prompts, name):
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    engine = engines(name)
    a = engine.generate(GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(7)))
    b = engine.generate(GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(7)))
    c = engine.generate(GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(8)))
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # The n samples of one prompt are not copies of each other.
    assert len({tuple(row.tolist()) for row in a.completion_ids[:4]}) > 1


@pytest.mark.parametrize("name", ENGINES)
def test_greedy_is_argmax_scored_at_temperature_one(engines, model, prompts, name):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    r = engines(name).generate(
        GenerationRequest(prompts, 2, params, torch.Generator().manual_seed(0))
    )
    check_contract(r, prompts, 2, params, {EOS_ID})
    assert torch.equal(r.completion_ids[0::2], r.completion_ids[1::2])  # no randomness
    diff = (_rescore(model, r, 1.0) - r.logprobs).abs().max()
    assert float(diff) <= LOGPROB_TOL
    # Each greedy token is the trainer's argmax at its position.
    with torch.no_grad():
        ids = torch.cat([r.prompt_ids, r.completion_ids], dim=1)
        mask = torch.cat([r.prompt_mask, r.completion_mask], dim=1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    width = r.prompt_ids.shape[1]
    best = logits[:, width - 1 : -1].argmax(-1)  # [N, L]
    keep = r.completion_mask.bool()
    assert torch.equal(best[keep], r.completion_ids[keep])


@pytest.mark.parametrize("name", ENGINES)
def test_bad_arguments(engines, prompts, name):
    engine = engines(name)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(GenerationRequest(prompts, 0, SamplingParams()))
    with pytest.raises(ValueError, match="non-empty"):
        engine.generate(GenerationRequest([[]], 1, SamplingParams()))
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(GenerationRequest(prompts, 1, SamplingParams(temperature=-1.0)))
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(GenerationRequest(prompts, 1, SamplingParams(top_p=0.0)))


def test_each_declared_engine_module_has_require_and_build():
    # config/options.py declares each by its module, whose require and build the registry
    # calls. (Importing the vLLM one imports no vllm: that waits for its first engine.)
    for kind in ROLLOUT_ENGINES.values():
        implementation = importlib.import_module(kind.module)
        assert callable(implementation.require) and callable(implementation.build), kind
