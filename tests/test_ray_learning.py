"""2 FSDP2 training ranks + 1 rollout worker on Ray learn the addition demo from a short SFT
checkpoint (the torch-engine setup of test_vllm_train.py, on the Ray backend)."""

from __future__ import annotations

import json
import os

import pytest
from cold_start import ADDITION_D64

from gspo.interface.cli import main

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

COMMON = ["--device", "cpu", "--threads", "1", "--progress", "false"]


@pytest.mark.slow
def test_ray_backend_learns_the_addition_demo(tmp_path):
    """The stored cold start (tests/cold_start.py), then 150 GSPO steps with --backend ray
    --trainer-workers 2 --rollout-workers 1. Measured on a 2-core machine: training reward
    (mean of steps 1-25 -> 101-150) 0.538 -> 0.624 (the local torch run: 0.538 -> 0.657);
    held-out greedy accuracy 0.535 -> 0.810 (local: 0.86; 200 problems, one seed swings by
    about +-0.1, hence the loose bounds)."""
    sft = ADDITION_D64  # the stored cold start (tests/cold_start.py)
    out = tmp_path / "ray"
    args = ["train", "--preset", "demo", "--model", str(sft), "--steps", "150", "--lr", "3e-4"]
    args += ["--eval-every", "150", "--checkpoint-every", "0", "--seed", "0"]
    args += ["--backend", "ray", "--trainer-workers", "2", "--rollout-workers", "1"]
    assert main([*args, "--output-dir", str(out), *COMMON]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    evals = [r["eval/greedy_accuracy"] for r in records if "eval/greedy_accuracy" in r]
    first, last = sum(rewards[:25]) / 25, sum(rewards[-50:]) / 50
    print(
        f"reward {first:.3f} -> {last:.3f}; held-out greedy accuracy {evals[0]:.3f} -> {evals[-1]:.3f}"
    )
    assert len(rewards) == 150 and len(evals) == 2
    assert last > first + 0.005  # the training reward rises ...
    assert evals[-1] > evals[0] + 0.03  # ... and so does held-out accuracy
    assert (out / "final" / "model.safetensors").is_file()
