"""The lean Llama-family forward (gspo.models.fast_forward) against the Hugging Face forward: rollout
decoding (FastDecoder inside TorchEngine) and the shared-prompt training pass."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import gspo.models.fast_forward as ff
from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.fast_forward import completion_logits, supports
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import SamplingParams
from gspo.rollout.base import GenerationRequest
from gspo.rollout.torch_engine import TorchEngine

PROMPTS = ["12+3=", "7=", "100-99=", "ab cd"]


def _llama(seed: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=98,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def _qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=98,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # q/k/v biases are zero at init: make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


MODELS = {
    "qwen3": lambda: build_tiny_model(98, hidden_size=32, num_layers=2, seed=3),
    "llama": _llama,
    "qwen2": _qwen2,
}


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(t)["input_ids"] for t in PROMPTS]  # lengths differ: left padding


def test_supports_plain_models_only():
    for make in MODELS.values():
        assert supports(make())
    m = MODELS["qwen3"]()
    handle = m.lm_head.register_forward_hook(lambda mod, args, out: out)
    assert not supports(m)  # hooks (routing capture, test probes) need the HF forward
    handle.remove()
    assert supports(m)
    from gspo.models.moe import build_tiny_moe_model

    assert not supports(build_tiny_moe_model(98, hidden_size=32, num_layers=1))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_fast_engine_equals_hf_engine_float64(name, top_p, tok, prompts):
    model = MODELS[name]().double()
    params = SamplingParams(max_new_tokens=9, temperature=0.8, top_p=top_p, stop_strings=("=",))
    out = {}
    for fast in (True, False):
        eng = TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, tokenizer=tok, fast=fast)
        out[fast] = eng.generate(
            GenerationRequest(prompts, 3, params, torch.Generator().manual_seed(5))
        )
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert out[True].finish_reasons == out[False].finish_reasons
    torch.testing.assert_close(out[True].logprobs, out[False].logprobs, atol=1e-9, rtol=0)
    r = out[True]
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, temperature=0.8
        )
    torch.testing.assert_close(r.logprobs, lp, atol=1e-9, rtol=0)


def test_fast_engine_float32_and_greedy(tok, prompts):
    model = MODELS["qwen3"]()
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    a = TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, fast=True).generate(
        GenerationRequest(prompts, 2, params)
    )
    b = TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, fast=False).generate(
        GenerationRequest(prompts, 2, params)
    )
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def _batch(tok, n_rep: int = 3, length: int = 6, seed: int = 0):
    """Rows i*n_rep+j share prompt i (left-padded); random completions with ragged masks."""
    g = torch.Generator().manual_seed(seed)
    ids = [tok(t)["input_ids"] for t in PROMPTS]
    width = max(map(len, ids))
    p_ids = torch.full((len(ids), width), PAD_ID)
    p_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        p_ids[i, width - len(row) :] = torch.tensor(row)
        p_mask[i, width - len(row) :] = 1
    index = torch.arange(len(ids)).repeat_interleave(n_rep)  # [N]
    n = len(index)
    c_ids = torch.randint(3, 98, (n, length), generator=g)
    lengths = torch.randint(1, length + 1, (n,), generator=g)
    c_mask = (torch.arange(length)[None] < lengths[:, None]).long()  # [N, L]
    c_ids = c_ids.masked_fill(c_mask == 0, PAD_ID)
    perm = torch.randperm(n, generator=g)  # rows of a prompt need not be adjacent
    return p_ids[index][perm], p_mask[index][perm], c_ids[perm], c_mask[perm], index[perm]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shared_prompt_logprobs_and_gradients(name, tok):
    model = MODELS[name]().train()
    p_ids, p_mask, c_ids, c_mask, index = _batch(tok)
    plain, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    shared, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask, prompt_index=index)
    torch.testing.assert_close(shared, plain, atol=2e-5, rtol=0)
    params = list(model.parameters())
    weights = torch.randn_like(plain)  # a generic loss of the log-probs
    g_plain = torch.autograd.grad((plain * weights).sum(), params)
    g_shared = torch.autograd.grad((shared * weights).sum(), params)
    for a, b in zip(g_shared, g_plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4 * float(b.abs().max()) + 1e-7, rtol=1e-4)


def test_lean_training_pass_float64_is_exact(tok):
    model = MODELS["qwen3"]().double().train()
    p_ids, p_mask, c_ids, c_mask, index = _batch(tok, seed=1)
    plain, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    lean, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask, prompt_index=index)
    torch.testing.assert_close(lean, plain, atol=1e-12, rtol=0)
    params = list(model.parameters())
    for a, b in zip(
        torch.autograd.grad(lean.sum(), params),
        torch.autograd.grad(plain.sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_completion_logits_single_token_completions(tok):
    model = MODELS["llama"]()
    p_ids, p_mask, c_ids, c_mask, index = _batch(tok, length=1)
    logits = completion_logits(model, p_ids, p_mask, c_ids, c_mask, index)  # [N, 1, V]
    ref = model(
        input_ids=p_ids, attention_mask=p_mask, position_ids=(p_mask.cumsum(-1) - 1).clamp(min=0)
    ).logits[:, -1:]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_causal_layout_equals_masked_attention(name, tok):
    """Long completions' layout (prompt padding rolled to the end, unmasked causal attention) is
    the masked attention: equal logits and gradients in float64, left-padded prompts shared."""
    model = MODELS[name]().double().train()
    p_ids, p_mask, c_ids, c_mask, index = _batch(tok, length=12, seed=2)
    assert not p_mask.bool().all()  # some prompts are padded
    masked = completion_logits(model, p_ids, p_mask, c_ids, c_mask, index, causal=False)
    causal = completion_logits(model, p_ids, p_mask, c_ids, c_mask, index, causal=True)
    keep = c_mask.bool()  # [N, L]: a completion's trailing pads are never scored
    torch.testing.assert_close(causal[keep], masked[keep], atol=1e-12, rtol=0)
    params = list(model.parameters())
    weights = torch.randn(causal.shape, dtype=causal.dtype) * keep[..., None]  # [N, L, V]
    for a, b in zip(
        torch.autograd.grad((causal * weights).sum(), params),
        torch.autograd.grad((masked * weights).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("blocks", [2, 3, 5])
def test_query_blocks_equal_one_masked_attention(name, blocks, tok, monkeypatch):
    """The masked layout's attention in blocks of queries (completions of BLOCKED_MIN_TOKENS and
    more; lowered here) is the one-call attention: equal logits and gradients in float64, with
    left-padded shared prompts and blocks of unequal sizes (11 queries)."""
    model = MODELS[name]().double().train()
    p_ids, p_mask, c_ids, c_mask, index = _batch(tok, length=12, seed=3)
    assert not p_mask.bool().all()  # some prompts are padded
    one = completion_logits(model, p_ids, p_mask, c_ids, c_mask, index, causal=False)
    monkeypatch.setattr(ff, "BLOCKED_MIN_TOKENS", 2)
    monkeypatch.setattr(ff, "QUERY_BLOCKS", blocks)
    blocked = completion_logits(model, p_ids, p_mask, c_ids, c_mask, index, causal=False)
    torch.testing.assert_close(blocked, one, atol=1e-12, rtol=0)
    params = list(model.parameters())
    weights = torch.randn(one.shape, dtype=one.dtype)  # [N, L, V]
    for a, b in zip(
        torch.autograd.grad((blocked * weights).sum(), params),
        torch.autograd.grad((one * weights).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("causal", [False, True])
def test_sampled_pad_token_gets_no_embedding_gradient(name, causal, tok):
    """A policy can sample the pad token; nn.Embedding(padding_idx=pad) gives its row no gradient
    from the lookup, and neither may the lean pass (it once did: with a zero pad row, RMSNorm's
    gradient at 0, ~1/sqrt(eps), then dominated the clipped norm; tests/test_trl_parity.py)."""
    model = MODELS[name]().double().train()
    p_ids, p_mask, c_ids, c_mask, index = _batch(tok, length=6, seed=3)
    c_ids[:, 0] = PAD_ID  # inside every completion's mask (lengths are >= 1), fed back as input
    c_mask[:, :2] = 1
    params = list(model.parameters())
    plain, _ = token_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    lean = completion_logits(model, p_ids, p_mask, c_ids, c_mask, index, causal=causal)
    lean = torch.log_softmax(lean, -1).gather(-1, c_ids[..., None])[..., 0] * c_mask  # [N, L]
    torch.testing.assert_close(lean, plain, atol=1e-12, rtol=0)
    for a, b in zip(
        torch.autograd.grad(lean.sum(), params),
        torch.autograd.grad(plain.sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
