"""Tests for gspo.models: char tokenizer, tiny Qwen3 builder, checkpoint I/O, token_logprobs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gspo.models.char_tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer, encode_strict
from gspo.models.logprobs import positions_from_mask, token_logprobs
from gspo.models.model_io import load_model, load_tokenizer, save_model
from gspo.models.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model64(tok):
    return build_tiny_model(len(tok), hidden_size=32, num_layers=2, seed=3).double()


# ------------------------------------------------------------------------------ tokenizer


@pytest.mark.parametrize(
    "text",
    ["12+35=47", "  leading and trailing  ", "a . b , c 's n't ?!", "x  y   z", " ", "~`{}|<>"],
)
def test_tokenizer_round_trip(tok, text):
    ids = tok(text)["input_ids"]
    assert ids[0] == BOS_ID
    assert len(ids) == len(text) + 1  # one token per character
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids[1:]) == text
    assert encode_strict(tok, text) == ids
    assert encode_strict(tok, text, add_special_tokens=False) == ids[1:]


def test_tokenizer_vocab_and_special_ids(tok):
    assert len(tok) == 3 + 95 + 1 + 1  # specials, printable ASCII, newline, <unk>
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 97, 98, 99]) == [
        "<pad>",
        "<bos>",
        "<eos>",
        " ",
        "~",
        "\n",
        "<unk>",
    ]
    # Character c has id ord(c) - 32 + 3.
    assert tok("a~", add_special_tokens=False)["input_ids"] == [ord("a") - 29, ord("~") - 29]
    # Decoding with the EOS included keeps it visible unless skipped.
    ids = [*tok("7")["input_ids"], EOS_ID]
    assert tok.decode(ids, skip_special_tokens=True) == "7"


def test_tokenizer_pads_left(tok):
    enc = tok(["ab", "abcd"], padding=True)
    assert enc["input_ids"][0][:2] == [PAD_ID, PAD_ID]
    assert enc["attention_mask"] == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert enc["input_ids"][0][2] == BOS_ID


@pytest.mark.parametrize("text", ["café", "tab\there", "π=3", "5 €", "hi 🙂"])
def test_encode_strict_rejects_unknown_chars(tok, text):
    with pytest.raises(ValueError, match="not in the tokenizer vocabulary"):
        encode_strict(tok, text)


def test_tokenizer_save_load(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    tok2 = load_tokenizer(tmp_path)
    text = " a b, c! "
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.decode(tok2(text)["input_ids"], skip_special_tokens=True) == text
    assert tok2.padding_side == "left"
    assert tok2.pad_token_id == PAD_ID


# ------------------------------------------------------------------------------ models


def test_build_tiny_model_deterministic_and_rng_neutral(tok):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=7)
    after = torch.rand(3)
    assert torch.equal(before, after)  # global RNG untouched by the build
    b = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=7)
    c = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_build_tiny_model_config(tok):
    m = build_tiny_model(len(tok))
    cfg = m.config
    assert cfg.hidden_size == 64 and cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2
    assert cfg.head_dim == 16
    assert cfg.intermediate_size == 168  # 8/3 * 64 = 170.7, rounded to a multiple of 8
    assert cfg.vocab_size == len(tok)
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()  # tied
    assert m.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError):
        build_tiny_model(len(tok), hidden_size=30, num_heads=4)


def test_save_load_round_trip(tok, tmp_path):
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=2, seed=1)
    save_model(m, tok, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    m2 = load_model(tmp_path / "ckpt")
    tok2 = load_tokenizer(tmp_path / "ckpt")
    ids = torch.tensor([tok2("3+4=7")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(m(ids).logits, m2(ids).logits)
    assert m2.lm_head.weight.data_ptr() == m2.model.embed_tokens.weight.data_ptr()
    assert m2.config._attn_implementation == "sdpa"
    m3 = load_model(tmp_path / "ckpt", dtype="float64")
    assert m3.lm_head.weight.dtype == torch.float64


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a checkpoint"):
        load_model(tmp_path)  # exists, but empty
    with pytest.raises(ValueError, match="not a checkpoint"):
        load_tokenizer(tmp_path)
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ValueError):
        load_model(f)


# ------------------------------------------------------------------------------ token_logprobs


def _batch(tok, prompts: list[str], completions: list[str]):
    """Left-padded prompts and right-padded completions (with EOS), as the engine lays them out."""
    enc = tok(prompts, padding=True, return_tensors="pt")
    comp = [[*tok(c, add_special_tokens=False)["input_ids"], EOS_ID] for c in completions]
    width = max(len(c) for c in comp)
    cids = torch.full((len(comp), width), PAD_ID)  # [N, L]
    cmask = torch.zeros((len(comp), width), dtype=torch.long)  # [N, L]
    for i, c in enumerate(comp):
        cids[i, : len(c)] = torch.tensor(c)
        cmask[i, : len(c)] = 1
    return enc["input_ids"], enc["attention_mask"], cids, cmask


def _naive(model, pids, pmask, cids, cmask, temperature=1.0):
    """Row by row, without any padding: the reference for token_logprobs."""
    lps, ents = [], []
    for i in range(pids.shape[0]):
        p = pids[i][pmask[i].bool()]  # [P_i]
        c = cids[i][cmask[i].bool()]  # [L_i]
        x = torch.cat([p, c]).unsqueeze(0)  # [1, P_i+L_i]
        logits = model(x).logits[0, p.numel() - 1 : -1] / temperature  # [L_i, V]
        la = F.log_softmax(logits, -1)  # [L_i, V]
        lp = torch.zeros(cids.shape[1], dtype=la.dtype)  # [L]
        ent = torch.zeros(cids.shape[1], dtype=la.dtype)  # [L]
        lp[: c.numel()] = la.gather(-1, c.unsqueeze(-1)).squeeze(-1)
        ent[: c.numel()] = -(la.exp() * la).sum(-1)
        lps.append(lp)
        ents.append(ent)
    return torch.stack(lps), torch.stack(ents)


PROMPTS = ["12+3=", "7=", "100-99=", "a"]
COMPLETIONS = ["15", "7 7", "1", "bcdef"]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_token_logprobs_matches_naive_float64(tok, model64, temperature):
    pids, pmask, cids, cmask = _batch(tok, PROMPTS, COMPLETIONS)
    with torch.no_grad():
        lp, ent = token_logprobs(
            model64, pids, pmask, cids, cmask, temperature=temperature, with_entropy=True
        )
        ref_lp, ref_ent = _naive(model64, pids, pmask, cids, cmask, temperature)
    assert lp.shape == cids.shape and lp.dtype == torch.float64
    torch.testing.assert_close(lp, ref_lp, atol=1e-9, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-9, rtol=0)
    assert (lp[cmask == 0] == 0).all() and (ent[cmask == 0] == 0).all()
    assert (lp[cmask == 1] < 0).all()


def test_token_logprobs_float32(tok):
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=2, seed=5)
    pids, pmask, cids, cmask = _batch(tok, PROMPTS, COMPLETIONS)
    with torch.no_grad():
        lp, ent = token_logprobs(m, pids, pmask, cids, cmask)
        ref_lp, _ = _naive(m, pids, pmask, cids, cmask)
    assert ent is None
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)


def test_token_logprobs_extra_left_padding_is_invisible(tok, model64):
    pids, pmask, cids, cmask = _batch(tok, PROMPTS, COMPLETIONS)
    pad = torch.full((pids.shape[0], 3), PAD_ID)  # [N, 3]
    with torch.no_grad():
        a, _ = token_logprobs(model64, pids, pmask, cids, cmask)
        b, _ = token_logprobs(
            model64,
            torch.cat([pad, pids], 1),
            torch.cat([torch.zeros_like(pad), pmask], 1),
            cids,
            cmask,
        )
    torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


def test_token_logprobs_temperature_zero_is_one(tok, model64):
    pids, pmask, cids, cmask = _batch(tok, PROMPTS, COMPLETIONS)
    with torch.no_grad():
        a, _ = token_logprobs(model64, pids, pmask, cids, cmask, temperature=0.0)
        b, _ = token_logprobs(model64, pids, pmask, cids, cmask, temperature=1.0)
    assert torch.equal(a, b)


def test_token_logprobs_is_differentiable(tok):
    m = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=2).double()
    m.train()
    pids, pmask, cids, cmask = _batch(tok, PROMPTS, COMPLETIONS)
    lp, ent = token_logprobs(m, pids, pmask, cids, cmask, with_entropy=True)
    assert lp.requires_grad and not ent.requires_grad
    (lp.sum() / cmask.sum()).backward()
    grads = [p.grad for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert m.model.embed_tokens.weight.grad.abs().sum() > 0


def test_positions_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_one_tiny_builder_for_dense_and_moe_models():
    from gspo.models.moe import build_tiny_moe_model, is_moe

    dense = build_tiny_model(99, hidden_size=32, num_layers=1, seed=4)
    moe = build_tiny_model(99, hidden_size=32, num_layers=1, seed=4, num_experts=4, top_k=2)
    assert not is_moe(dense) and is_moe(moe)
    assert type(moe).__name__ == "Qwen3MoeForCausalLM"
    # The MoE builder is that one builder with experts: same weights for the same arguments.
    same = build_tiny_moe_model(99, hidden_size=32, num_layers=1, seed=4, num_experts=4, top_k=2)
    a, b = moe.state_dict(), same.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="num_experts"):
        build_tiny_moe_model(99, num_experts=0)
