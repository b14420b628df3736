"""``benchmarks/growth.py``: the fitted exponent, the sweep points, the argument checks and the
alternation order (the runs themselves are faked: no training, no timing asserted)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def growth(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("baseline", "vs_trl", "growth"):
        sys.modules.pop(name, None)
    yield importlib.import_module("growth")
    for name in ("baseline", "vs_trl", "growth"):
        sys.modules.pop(name, None)


def test_exponent_is_the_log_log_slope(growth):
    xs = [64.0, 128.0, 256.0, 512.0]
    assert growth.fit_exponent(xs, [3 * x**2 for x in xs]) == pytest.approx(2.0)
    assert growth.fit_exponent(xs, [0.5 * x for x in xs]) == pytest.approx(1.0)
    assert growth.fit_exponent([64.0], [1.0]) is None


def test_points_vary_one_thing_from_the_base(growth):
    model, over = growth.point_overrides("length", 256)
    assert model == "tiny" and over["max_new_tokens"] == 256 and over["group_size"] == 8
    model, over = growth.point_overrides("model", "d512")
    assert over["size"]["hidden_size"] == 512 and over["max_new_tokens"] == 64
    assert growth.point_overrides("model", "smollm2")[0] == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sweeps", "width"], "unknown sweep/system ['width']"),
        (["--sweeps", "length", "--points", "group=4,8"], "name one of the sweeps"),
        (["--sweeps", "model", "--points", "model=d64,d99"], "unknown model size ['d99']"),
        (["--sweeps", "length", "--points", "64,x"], "length points are integers"),
        (["--steps", "1"], "--steps must be >= 2"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(growth, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        growth.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_systems_alternate_point_by_point(growth, monkeypatch, tmp_path, capsys):
    calls = []

    def fake_run(spec, script):
        over = spec["workload_overrides"]
        calls.append((spec["system"], over["max_new_tokens"]))
        tokens = over["max_new_tokens"]
        step_s = (1e-3 if spec["system"] == "gspo" else 2e-3) * tokens
        # a rollout of constant cost, so the rest carries all the growth
        return {"step_s": step_s + 0.5, "rollout_s": 0.5, "params": 1000}

    monkeypatch.setattr(growth.vs_trl, "run_in_subprocess", fake_run)
    monkeypatch.setattr(growth, "plot", lambda results, path: None)
    out = tmp_path / "g.json"
    growth.main(["--sweeps", "length", "--points", "64,128,256", "--steps", "2", "--out", str(out)])
    assert calls == [
        ("gspo", 64),
        ("trl", 64),
        ("trl", 128),
        ("gspo", 128),
        ("gspo", 256),
        ("trl", 256),
    ]
    result = json.loads(out.read_text())["results"]["length"]
    assert result["exponent_rest"]["gspo"] == pytest.approx(1.0)
    assert result["exponent_rest"]["trl"] == pytest.approx(1.0)
    assert result["exponent_rollout"] == {"gspo": 0.0, "trl": 0.0}
    assert 0 < result["exponent"]["gspo"] < result["exponent"]["trl"] < 1
    text = capsys.readouterr().out
    assert "| length | 64 | 0.564 (0.500 / 0.064) | 0.628 (0.500 / 0.128) | 1.11x |" in text
    assert "| length | **exponent** | 0.21 (0.00 / 1.00) | 0.34 (0.00 / 1.00) | |" in text


def test_repetitions_are_whole_sweeps_back_and_forth(growth):
    assert growth.sweep_order(3, 2) == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    assert growth.sweep_order(2, 1) == [(0, 0), (0, 1)]


def test_exponent_difference_is_paired_by_repetition(growth, monkeypatch, tmp_path, capsys):
    """Two sweeps: gspo's step grows as x^1 in both, TRL's as x^1.5 then x^1.3; the difference
    per repetition is -0.5 and -0.3, mean -0.4, and its interval (t at 1 df) spans 0."""
    calls = []

    def fake_run(spec, script):
        tokens, rep = spec["workload_overrides"]["max_new_tokens"], spec["rep"]
        calls.append((rep, tokens, spec["system"]))
        k = 1.0 if spec["system"] == "gspo" else (1.5, 1.3)[rep]
        return {"step_s": 1e-3 * tokens**k, "rollout_s": 0.0, "params": 1000}

    monkeypatch.setattr(growth.vs_trl, "run_in_subprocess", fake_run)
    monkeypatch.setattr(growth, "plot", lambda results, path: None)
    out = tmp_path / "g.json"
    argv = ["--sweeps", "length", "--points", "64,256", "--steps", "2", "--reps", "2"]
    growth.main([*argv, "--out", str(out)])
    assert [c[:2] for c in calls[::2]] == [(0, 64), (0, 256), (1, 256), (1, 64)]
    result = json.loads(out.read_text())["results"]["length"]
    assert result["exponent_per_rep"]["trl"] == pytest.approx([1.5, 1.3])
    diff = result["exponent_difference"]
    assert diff["differences"] == pytest.approx([-0.5, -0.3])
    assert diff["mean"] == pytest.approx(-0.4)
    low, high = diff["ci95"]
    assert low < -0.5 and high > 0 and diff["verdict"] == "cannot tell"
    assert "gspo − TRL exponent, paired by repetition | -0.40" in capsys.readouterr().out
