"""``benchmarks/sdpa_training.py``: its formulations compute one attention and one gradient (to
float rounding), and a tiny run writes its table's JSON (no timing asserted)."""

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
    sys.modules.pop("sdpa_training", None)
    yield importlib.import_module("sdpa_training")
    sys.modules.pop("sdpa_training", None)


def test_formulations_agree_with_causal_attention(bench):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=gen).requires_grad_() for _ in "qkv")
    fns = bench.formulations(q, k, v)
    assert tuple(fns) == bench.NAMES
    ref = fns["causal"]()
    grads = torch.autograd.grad(ref.sum(), (q, k, v))
    # the first query sees only the first key: the output there is its value
    torch.testing.assert_close(ref[:, :, 0], v[:, :, 0])
    for name, fn in fns.items():
        out = fn()
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5, msg=name)
        for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=name)


def test_a_tiny_run_writes_its_json(bench, tmp_path, capsys):
    out = tmp_path / "s.json"
    tiny = ["--lengths", "16", "--rows", "1", "--heads", "2", "--dim", "4", "--reps", "1"]
    bench.main([*tiny, "--out", str(out)])
    res = json.loads(out.read_text())
    assert set(res["results"]["16"]["median_ms"]) == set(bench.NAMES)
    assert "| 16 | chunk8 |" in capsys.readouterr().out
