"""benchmarks/engines.py: rounds alternate the engines' order, and the summary pairs each
engine's tok/s with the torch engine's of the same round (no vLLM needed: runs are faked)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def engines(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("engines", None)
    return importlib.import_module("engines")


def _row(model, engine, rnd, tps):
    return {
        "model": model,
        "engine": engine,
        "round": rnd,
        "start_s": 1.0,
        "tokens_per_s": tps,
        "rss_mb": 100.0,
        "rss_engine_mb": 10.0,
        "sync_s": 0.01,
    }


def test_summary_pairs_rounds(engines):
    rows = [
        _row("m", "torch", 0, 100.0),
        _row("m", "vllm", 0, 50.0),  # 0.5 in round 0
        _row("m", "vllm", 1, 300.0),  # 1.0 in round 1 (a faster round for both)
        _row("m", "torch", 1, 300.0),
        _row("m", "vllm", 2, 80.0),  # 0.8 in round 2
        _row("m", "torch", 2, 100.0),
    ]
    by = {r["engine"]: r for r in engines.summarize(rows)}
    assert by["torch"]["vs_torch"] == 1.0
    assert by["vllm"]["vs_torch"] == pytest.approx(0.8)  # median of 0.5, 1.0, 0.8
    assert by["vllm"]["tokens_per_s"] == 80.0  # median of 50, 300, 80
    assert (by["vllm"]["tokens_per_s_min"], by["vllm"]["tokens_per_s_max"]) == (50.0, 300.0)
    assert by["vllm"]["rounds"] == 3


def test_no_torch_row_no_ratio(engines):
    (only,) = engines.summarize([_row("m", "vllm", 0, 50.0)])
    assert only["vs_torch"] is None


def test_rounds_alternate_order(engines, monkeypatch, tmp_path, capsys):
    calls = []

    def fake(args, model, engine):
        calls.append((model, engine))
        return _row(model, engine, 0, 10.0)

    monkeypatch.setattr(engines, "_run_one", fake)
    engines.main(
        [
            "--models", "a,b", "--engines", "torch,vllm", "--rounds", "3",
            "--out", str(tmp_path / "e.json"),
        ]
    )  # fmt: skip
    order = [e for m, e in calls if m == "a"]
    assert order == ["torch", "vllm", "vllm", "torch", "torch", "vllm"]
    assert [m for m, _ in calls] == ["a"] * 6 + ["b"] * 6
    assert "| a | vllm |" in capsys.readouterr().out
