"""``benchmarks/decode_attention.py``: its variants compute one attention (to float rounding),
the reference variant is bit for bit what ``FastDecoder.decode`` computes, and a tiny run writes
its table's JSON (no timing asserted)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("decode_attention", None)
    yield importlib.import_module("decode_attention")
    sys.modules.pop("decode_attention", None)


def test_variants_agree(bench):
    fns = bench.variants(torch, layers=2)
    for s in (4, 7, 300):  # the padded rows mask columns 0-2
        ref = fns["bmm"](1, s)  # [N, H, 1, D]
        assert ref.shape == (bench.ROWS, bench.HEADS, 1, bench.HEAD_DIM)
        assert torch.isfinite(ref).all()
        for name, f in fns.items():
            torch.testing.assert_close(f(1, s), ref, rtol=1e-5, atol=1e-5, msg=name)


def test_reference_is_the_decoders_own_step(bench):
    """FastDecoder.decode's attention output equals ``bmm_attention`` on the same q and cache,
    bit for bit (a padded prompt, so the bias is used)."""
    from gspo.models.tiny_model import build_tiny_model
    from gspo.rollout.torch_decode import FastDecoder

    model = build_tiny_model(
        40, hidden_size=64, num_layers=1, num_heads=bench.HEADS, num_kv_heads=bench.KV_HEADS
    )
    dec = FastDecoder(model, batch=2, max_len=12)
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    dec.prefill(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    st, seen = dec.stack, {}
    qkv, out_and_mlp = st.qkv, st.out_and_mlp

    def spy_qkv(*a):
        seen["q"] = qkv(*a)[0]  # [N, H, 1, D]
        return qkv(*a)

    def spy_out(w, x, o):
        seen["o"] = o  # [N, 1, H*D]
        return out_and_mlp(w, x, o)

    st.qkv, st.out_and_mlp = spy_qkv, spy_out
    dec.decode(torch.tensor([12, 13]), torch.tensor([3, 4]))
    s = dec.length
    expected = bench.bmm_attention(
        torch,
        seen["q"],
        dec.keys[0][:, :, :s],
        dec.values[0][:, :, :s],
        dec.key_bias[..., :s],
        st.scaling,
    )  # [N, H, 1, D]
    assert torch.equal(seen["o"], expected.reshape(2, 1, -1))


def test_tiny_run_writes_json(bench, tmp_path, capsys):
    out = tmp_path / "r.json"
    bench.main(
        [
            "--lengths",
            "5,9",
            "--rounds",
            "2",
            "--steps",
            "1",
            "--layers",
            "2",
            "--out",
            str(out),
            "--profile-rollout",
            "3",
        ]
    )
    data = json.loads(out.read_text())
    assert [r["length"] for r in data["rows"]] == [5, 9]
    assert data["rows"][0]["equal"]["bmm"] is True
    assert set(data["rows"][0]["us"]) == {"bmm", "keys_t", "tall", "sdpa_gqa", "hf"}
    printed = capsys.readouterr().out
    assert "| cache columns |" in printed and "aten::" in printed  # the rollout's profile
