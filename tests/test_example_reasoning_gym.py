"""examples/reasoning_gym_reward.py: reasoning-gym's own scorer as a reward, its task named on
the command line from the repository root (``--task examples.reasoning_gym_reward:build``).

Needs the reasoning-gym extra: it skips without it, except where GSPO_REQUIRE_REASONING_GYM=1
(`.ci/run`), where it must run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("GSPO_REQUIRE_REASONING_GYM") == "1":
    import reasoning_gym  # noqa: F401
else:
    pytest.importorskip("reasoning_gym")

ROOT = Path(__file__).resolve().parents[1]
# What the `gspo` script runs: main() with no working directory on sys.path (`python -c` puts
# one first: removed), so the CLI must find the user's modules itself.
GSPO_SCRIPT = "import sys; del sys.path[0]; from gspo.interface.cli import main; sys.exit(main())"
SRC = str(ROOT / "src")


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from examples import reasoning_gym_reward

    return reasoning_gym_reward


def test_the_reward_is_reasoning_gyms_verdict_and_the_splits_are_disjoint(example):
    task = example.build(n_train=200, n_test=30, seed=0)
    assert task.test and task.train
    assert not {ex.prompt for ex in task.train} & {ex.prompt for ex in task.test}
    ex = task.test[0]
    assert task.reward(ex.answer, ex) == 1.0
    assert task.reward(f" {ex.answer}\nmore text", ex) == 1.0  # the first line, stripped
    assert task.reward(ex.answer + "1", ex) < 1.0  # (reasoning-gym: 0.5, partial credit)
    # the dataset's own scorer decides (reasoning-gym gives partial credit to some answers)
    import reasoning_gym

    scorer = reasoning_gym.get_score_answer_fn("basic_arithmetic")
    assert task.reward("7", ex) == scorer(answer="7", entry=ex.meta["entry"])


@pytest.mark.slow
def test_the_example_trains_from_the_command_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = tmp_path / "rg"
    proc = subprocess.run(
        [sys.executable, "-c", GSPO_SCRIPT, "train", "--task",
         "examples.reasoning_gym_reward:build", "--preset", "demo", "--steps", "2",
         "--n-train", "64", "--n-test", "8", "--threads", "1", "--progress", "false",
         "--output-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "reward/mean" in r]) == 2
    assert rows[0]["data/test_problems"] == 8
    saved = json.loads((out / "config.json").read_text())
    assert saved["task"] == "examples.reasoning_gym_reward:build"
