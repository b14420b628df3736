"""examples/minimal_gspo.py, the whole GSPO loop in one file, computes what ``gspo train`` does:
with the same settings and seed, every metric it logs equals the library run's metrics.jsonl
bit for bit (timing and throughput fields aside: the example logs none)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from cold_start import ADDITION_D64

from gspo.compose.train import train
from gspo.config import TrainConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minimal_gspo.py"


def _example():
    spec = importlib.util.spec_from_file_location("minimal_gspo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["minimal_gspo"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


# Small enough for seconds on one core; the demo preset's algorithm settings otherwise (clip
# band, lr, warm-up, grad clip, zero-advantage split, temperature).
SMALL = dict(
    task="addition",
    n_train=64,
    n_test=8,
    steps=3,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=6,
    num_minibatches=2,
    lr=1e-4,
    eval_every=2,  # evaluations at steps 0, 2 and 3 (the last)
    device="cpu",
    threads=1,
)


def _library_records(tmp_path: Path, case: dict) -> list[dict]:
    out = tmp_path / "lib"
    cfg = TrainConfig.of(
        **{**SMALL, **case}, output_dir=str(out), checkpoint_every=0, progress=False
    )
    train(cfg)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    "case",
    [
        # From the cold-start SFT model: rewards vary within groups, so updates are real,
        # ratios leave 1, clipping happens and some minibatches split off zero-advantage rows.
        pytest.param({"model": str(ADDITION_D64)}, id="cold-start"),
        # Minibatches of 2 rows: some hold only zero-advantage rows after real updates (their
        # zero gradient still moves the weights, through Adam's moments).
        pytest.param({"model": str(ADDITION_D64), "num_minibatches": 8}, id="cold-start-8mb"),
        # A random-init tiny model scores 0 everywhere: every advantage is 0, every minibatch
        # is all zero-advantage rows (zero gradients, Adam still steps).
        pytest.param(
            {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
            id="random-init",
        ),
    ],
)
def test_example_metrics_equal_gspo_train(tmp_path: Path, case: dict) -> None:
    ex = _example()
    got = ex.run(ex.Settings(**{**SMALL, **case}))
    library = _library_records(tmp_path, case)
    # The library's records at each step (its step 0 also has a data/* record, and a step's
    # metrics and its evaluation are separate lines): merged per step and kind.
    want: dict[tuple[int, bool], dict] = {}
    for rec in library:
        is_eval = any(k.startswith("eval/") for k in rec)
        want.setdefault((rec["step"], is_eval), {}).update(rec)
    kinds = [(r["step"], any(k.startswith("eval/") for k in r)) for r in got]
    assert kinds == [(0, True), (1, False), (2, False), (2, True), (3, False), (3, True)]
    compared = 0
    for rec, kind in zip(got, kinds, strict=True):
        for key, value in rec.items():
            assert key in want[kind], f"step {kind[0]}: the library logs no {key}"
            assert value == want[kind][key], f"step {kind[0]} {key}: {value} != {want[kind][key]}"
            compared += 1
    # Every step record carries the loop's core metrics (a key the example stopped logging
    # would otherwise pass silently).
    core = {"reward/mean", "advantage/zero_fraction", "loss", "grad_norm", "ratio/mean",
            "clip/fraction", "kl/old_new", "entropy", "lr"}  # fmt: skip
    for rec in got:
        if "eval/avg@1" not in rec:
            assert core <= rec.keys()
    assert compared >= 3 * len(core) + 3 * 2


def test_cold_start_run_learns_something(tmp_path: Path) -> None:
    """The cold-start case is not trivially equal: its updates move the policy (ratios leave
    1 and some sequences are clipped), so the comparison above covers the GSPO math."""
    ex = _example()
    got = ex.run(ex.Settings(**{**SMALL, "steps": 1, "eval_every": 0}, model=str(ADDITION_D64)))
    (step,) = got
    assert 0 < step["reward/mean"] < 1
    assert step["clip/fraction"] > 0
    assert step["ratio/min"] < 1 < step["ratio/max"]


def test_script_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """The script prints one line per record; a missing --model or an unknown flag is one
    line on stderr and exit code 2."""
    ex = _example()
    args = ["--steps", "1", "--n-train", "8", "--n-test", "2", "--prompts-per-step", "2",
            "--group-size", "2", "--hidden-size", "16", "--num-layers", "1", "--num-heads", "2",
            "--num-kv-heads", "1", "--device", "cpu", "--eval-every", "0"]  # fmt: skip
    assert ex.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("step    1") and "reward/mean" in lines[0]

    assert ex.main(["--model", str(Path("no") / "such-model")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model" in err[0] and "gspo demo" in err[0]

    assert ex.main(["--task", "additon"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'addition'?" in err[0]

    with pytest.raises(SystemExit) as exc:
        ex.main(["--stepz", "3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stepz" in err[0]
