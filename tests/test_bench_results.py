"""Benchmarks never overwrite committed results: by default each run writes a new dated file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load_results_module():
    spec = importlib.util.spec_from_file_location("_bench_results", BENCH / "_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dated_result_is_new_and_never_an_existing_file(tmp_path, monkeypatch):
    results = load_results_module()
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    first = results.dated_result("scaling", when=0)
    assert first == tmp_path / "scaling-19700101-000000.json"
    first.write_text("{}")
    second = results.dated_result("scaling", when=0)
    assert second == tmp_path / "scaling-19700101-000000-2.json"


def test_no_benchmark_defaults_to_a_fixed_results_file():
    scripts = sorted(BENCH.glob("*.py"))
    assert len(scripts) >= 9
    for script in scripts:
        text = script.read_text()
        fixed = re.findall(r"--(?:out|output)\"[^)]*default=(?!None)[^)]*\)", text)
        assert fixed == [], f"{script.name}: {fixed}"
