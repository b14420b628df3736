"""An asynchronous Ray run (1 FSDP2 rank + 1 rollout worker, max_staleness 1) learns the
addition demo from a short SFT checkpoint (the setup of test_ray_learning.py, async)."""

from __future__ import annotations

import json
import os
import time

import pytest
from async_support import hold_updates_until_the_producer_blocks
from cold_start import ADDITION_D64

from gspo.interface.cli import main

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

COMMON = ["--device", "cpu", "--threads", "1", "--progress", "false"]


@pytest.mark.slow
def test_ray_async_run_learns_the_addition_demo(tmp_path, monkeypatch):
    """The stored cold start (tests/cold_start.py), then GSPO on the demo preset with
    --backend ray --trainer-workers 1 --rollout-workers 1 --max-staleness 1 (chunks of 4
    tokens). Measured on a 2-core machine: training reward (mean of steps 1-25 -> 101-150)
    0.531 -> 0.574 (the synchronous Ray run with 2 ranks: 0.538 -> 0.624), held-out greedy
    accuracy 0.535 -> 0.850, staleness mean 0.99 (every batch one version behind but the
    first); the same figures again with the thread held K ahead as below (47 s)."""
    # The thread is held exactly K versions ahead (no sleeps): which weights made which sample,
    # and so the run's figures, do not depend on the machine's load.
    probe = hold_updates_until_the_producer_blocks(monkeypatch)
    t0 = time.perf_counter()
    sft = ADDITION_D64  # the stored cold start (tests/cold_start.py)
    out = tmp_path / "ray-k1"
    steps = 150
    args = ["train", "--preset", "demo", "--model", str(sft), "--steps", str(steps)]
    args += ["--lr", "3e-4", "--eval-every", str(steps), "--checkpoint-every", "0"]
    args += ["--seed", "0", "--backend", "ray", "--trainer-workers", "1"]
    args += ["--rollout-workers", "1", "--max-staleness", "1", "--async-chunk-tokens", "4"]
    assert main([*args, "--output-dir", str(out), *COMMON]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in train]
    evals = [r["eval/greedy_accuracy"] for r in records if "eval/greedy_accuracy" in r]
    first, last = sum(rewards[:25]) / 25, sum(rewards[-50:]) / 50
    stale = sum(r["async/staleness_mean"] for r in train) / len(train)
    partial = sum(r["async/partial_fraction"] for r in train) / len(train)
    print(
        f"reward {first:.3f} -> {last:.3f}; held-out greedy accuracy {evals[0]:.3f} -> "
        f"{evals[-1]:.3f}; staleness mean {stale:.2f}, partial {partial:.2f}; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    assert len(rewards) == steps and len(evals) == 2
    assert [r["async/staleness_max"] for r in train] == [0] + [1] * (steps - 1)  # K ahead
    assert probe.blocked == steps - 2 and stale > 0.99
    assert last > first  # the training reward does not fall ...
    assert evals[-1] > evals[0] + 0.05  # ... and held-out accuracy rises
