"""Behaviour pinned by before-files: short fixed-seed runs must log the metrics the code logged
when the fixtures were written (issue 35's refactor, commit 736acfb). A change that alters what
a step computes (the order of RNG draws, a mask, a loss term) fails here; a change of layout does
not. The policy is float64 on one thread so that another CPU's SIMD width (rounding ~1e-16)
cannot flip a sampled token; the comparison allows 1e-9 relative for the same reason.

Rewrite the fixtures only for a change meant to alter behaviour, and say so in its commit:

    python tests/test_metrics_fixtures.py --write
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
TIMING = ("time/", "throughput/")

BASE = dict(device="cpu", dtype="float64", threads=1, seed=0, progress=False)
RUNS = {
    # one-turn GSPO with evaluation, minibatches and micro-batches
    "sync": dict(
        preset="smoke", steps=4, eval_every=2, n_test=4, micro_batch_size=3, lr=3e-3,
        max_new_tokens=8, overlong_buffer=6,
    ),
    # asynchronous, one version of staleness (the update waits for the producer: no timing)
    "async": dict(
        preset="smoke", steps=4, eval_every=2, n_test=4, lr=3e-3, max_new_tokens=8,
        overlong_buffer=6, max_staleness=1,
    ),
    # multi-turn episodes with tool calls and per-turn credit
    "episodes": dict(
        task="guess", steps=3, prompts_per_step=2, group_size=2, max_new_tokens=12,
        n_train=8, n_test=4, eval_every=3, max_total_tokens=40, num_minibatches=1,
        algo="gspo_token", credit="turn",
    ),
}  # fmt: skip


def _run(name: str, out: Path) -> list[dict]:
    from gspo.compose.train import train
    from gspo.config import TrainConfig, build

    values = {**BASE, **RUNS[name], "output_dir": str(out)}
    preset = values.pop("preset", None)
    train(build(TrainConfig, preset=preset, overrides=values))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING) and not k.endswith("_s")}
            for r in rows]  # fmt: skip


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("name", sorted(RUNS))
def test_metrics_equal_the_before_files(name, tmp_path, monkeypatch):
    if name == "async":
        from async_support import hold_updates_until_the_producer_blocks

        hold_updates_until_the_producer_blocks(monkeypatch)
    got = _run(name, tmp_path / name)
    want = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert set(g) == set(w), (name, i, set(g) ^ set(w))
        diff = [k for k in w if not _same(g[k], w[k])]
        assert not diff, (name, i, {k: (w[k], g[k]) for k in diff[:5]})


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for run_name in sorted(RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            if run_name == "async":  # the same deterministic producer as the test
                mp = pytest.MonkeyPatch()
                from async_support import hold_updates_until_the_producer_blocks

                hold_updates_until_the_producer_blocks(mp)
            rows = _run(run_name, Path(tmp) / run_name)
            if run_name == "async":
                mp.undo()
        (FIXTURES / f"{run_name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(run_name, len(rows), "rows")
