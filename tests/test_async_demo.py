"""An asynchronous run (max_staleness 1) learns the addition demo from a cold start."""

from __future__ import annotations

import json

import pytest
from async_support import hold_updates_until_the_producer_blocks
from cold_start import ADDITION_D64

from gspo.interface.cli import main

COMMON = ["--device", "cpu", "--threads", "1", "--progress", "false"]


@pytest.mark.slow
def test_async_run_learns_the_addition_demo(tmp_path, monkeypatch):
    """The stored cold start (tests/cold_start.py: the default tiny model, SFT seed 1), then
    300 GSPO steps of the demo preset with K = 1. Measured on a 2-core machine: training reward
    (mean of steps 1-25 -> 251-300) 0.547 -> 0.630, held-out greedy accuracy 0.535 -> 0.745
    (the same again with the thread held K ahead, as below)."""
    # The thread is held exactly K versions ahead (no sleeps): which weights made which sample,
    # and so the figures above, do not depend on the machine's load.
    probe = hold_updates_until_the_producer_blocks(monkeypatch)
    sft = ADDITION_D64  # the stored cold start (tests/cold_start.py)
    out = tmp_path / "k1"
    args = ["train", "--preset", "demo", "--model", str(sft), "--steps", "300", "--lr", "3e-4"]
    args += ["--eval-every", "300", "--checkpoint-every", "0", "--max-staleness", "1"]
    assert main([*args, "--seed", "0", "--output-dir", str(out), *COMMON]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in steps]
    evals = [r["eval/greedy_accuracy"] for r in records if "eval/greedy_accuracy" in r]
    assert len(steps) == 300
    assert [r["async/staleness_max"] for r in steps] == [0] + [1] * 299  # always K ahead
    assert probe.blocked == 298  # it waited at the bound before every update but the last two
    assert sum(rewards[-50:]) / 50 > sum(rewards[:25]) / 25 + 0.03
    assert evals[-1] > evals[0] + 0.05
