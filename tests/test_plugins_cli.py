"""A user's reward module and environment module train, evaluate and compare from the command
line with no launcher: plain modules written into the working directory, named as
``module:attribute`` or loaded with ``--plugin``, the CLI run from that directory the way the
``gspo`` script runs (no working directory on sys.path: the test removes it). Demo-sized, 2 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test runs gspo in fresh processes (tens of seconds)

# What the `gspo` script runs: main() with no working directory on sys.path (`python -c` puts
# one first: removed), so the CLI must find the user's modules itself.
GSPO_SCRIPT = "import sys; del sys.path[0]; from gspo.interface.cli import main; sys.exit(main())"
SRC = str(Path(__file__).resolve().parents[1] / "src")
SMALL = ["--preset", "demo", "--steps", "2", "--threads", "1", "--progress", "false"]

REWARDS = '''
def score(completion, example):
    """A constant, so its mark on the metrics is exact whatever the random model writes."""
    return 0.75
'''

GAME = '''
"""A two-turn game over the rows of the run's --train-file (the builder reads it itself)."""
import json
from pathlib import Path

from gspo import Example, Step, Task, register_env, register_task


def score(completion, example):
    return float(completion.strip() == example.answer)


def build(*, n_train, n_test, seed=0, difficulty=None, train_file=None):
    rows = [json.loads(line) for line in Path(train_file).read_text().splitlines()]
    examples = [Example(r["prompt"], r["answer"], demo=r["answer"]) for r in rows]
    return Task("game", examples[:n_train], examples[:n_test], score)


class Game:
    name = "game"
    multi_turn = True
    stop_strings = ()

    def reset(self, example):
        return {"example": example, "turns": 0}

    def step(self, state, text, finished):
        state["turns"] += 1
        if state["turns"] == 1 and finished:
            return Step(done=False, messages=[{"role": "user", "content": "sure="}])
        return Step(done=True, reward=score(text, state["example"]))


def make_env(task, opts, chat):
    Path("env_made_by_" + str(opts.max_turns)).write_text("")  # the run used this factory
    return Game()


register_task("game")(build)  # for --plugin game --task game
register_env("game")(make_env)  # under the name of the task build() makes
'''


def gspo(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", GSPO_SCRIPT, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "game.py").write_text(GAME)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_a_reward_module_trains_evaluates_and_compares(folder):
    data = ["--task", "file", "--train-file", "rows.jsonl", "--test-file", "rows.jsonl"]
    gspo(folder, "train", *SMALL, *data, "--reward", "my_rewards:score", "--output-dir", "run")
    steps = [m for m in metrics(folder / "run") if "reward/mean" in m]
    assert [m["reward/mean"] for m in steps] == [0.75, 0.75]
    assert json.loads((folder / "run" / "config.json").read_text())["reward"] == "my_rewards:score"
    gspo(
        folder,
        "eval",
        "--data",
        "rows.jsonl",
        "--reward",
        "my_rewards:score",
        "--model",
        "run/final",
        "--samples",
        "1",
        "--max-new-tokens",
        "8",
        "--threads",
        "1",
        "--progress",
        "false",
        "--output",
        "eval.json",
    )
    report = json.loads((folder / "eval.json").read_text())
    assert report["metrics"]["avg@1"] == 0.75 and report["metrics"]["problems"] == 16
    gspo(folder, "compare", "--algos", "grpo,gspo", "--seeds", "1", *SMALL, *data,
         "--reward", "my_rewards:score", "--output-dir", "cmp")  # fmt: skip
    for algo in ("grpo", "gspo"):
        run = folder / "cmp" / "runs" / f"{algo}_seed0"
        assert [m["reward/mean"] for m in metrics(run) if "reward/mean" in m] == [0.75, 0.75]


def test_an_environment_module_trains_evaluates_and_compares(folder):
    gspo(folder, "train", *SMALL, "--task", "game:build", "--env", "game:make_env",
         "--train-file", "rows.jsonl", "--max-turns", "3", "--output-dir", "run")  # fmt: skip
    assert (folder / "env_made_by_3").exists()  # the named factory, with the run's options
    steps = [m for m in metrics(folder / "run") if "reward/mean" in m]
    assert len(steps) == 2 and all("episode/turns_mean" in m for m in steps)  # multi-turn
    data = [m for m in metrics(folder / "run") if "data/train_problems" in m]
    assert data[0]["data/train_problems"] == 16  # the builder read the run's --train-file
    gspo(folder, "eval", "--task", "game:build", "--env", "game:make_env", "--model",
         "run/final", "--train-file", "rows.jsonl", "--n-test", "4", "--samples", "0",
         "--max-new-tokens", "8", "--threads", "1", "--progress", "false", "--output", "eval.json")  # fmt: skip
    assert json.loads((folder / "eval.json").read_text())["metrics"]["problems"] == 4
    proc = gspo(folder, "sft", "--task", "game:build", "--train-file", "rows.jsonl", "--steps",
                "2", "--n-test", "4", "--threads", "1", "--progress", "false",
                "--output-dir", "sft")  # fmt: skip
    assert "sft: 2 steps" in proc.stdout and (folder / "sft" / "config.json").is_file()
    # The same game from a plugin module: --plugin imports it, its registered names validate.
    gspo(folder, "compare", "--algos", "grpo,gspo", "--seeds", "1", *SMALL, "--plugin", "game",
         "--task", "game", "--train-file", "rows.jsonl", "--max-turns", "2",
         "--output-dir", "cmp")  # fmt: skip
    assert (folder / "env_made_by_2").exists()
    assert (folder / "cmp" / "report" / "summary.md").is_file()


def test_a_file_task_with_an_environment_that_pays_its_rewards_needs_no_reward(folder):
    data = ["--task", "file", "--train-file", "rows.jsonl", "--test-file", "rows.jsonl"]
    gspo(folder, "train", *SMALL, *data, "--env", "game:make_env", "--max-turns", "3",
         "--eval-every", "2", "--output-dir", "run")  # fmt: skip
    records = metrics(folder / "run")
    steps = [m for m in records if "reward/mean" in m]
    assert len(steps) == 2 and all("episode/turns_mean" in m for m in steps)  # the game's
    assert any("eval/turns_mean" in m for m in records)  # evaluated through it too
    assert json.loads((folder / "run" / "config.json").read_text())["reward"] is None
    # Without an environment the file task still needs a reward, in one line, exit 2.
    proc = subprocess.run([sys.executable, "-c", GSPO_SCRIPT, "train", *SMALL, *data],
                          cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC})  # fmt: skip
    assert proc.returncode == 2 and "task='file' needs reward" in proc.stderr


def test_a_run_with_a_plugin_resumes_from_its_saved_config(folder):
    # config.json and the checkpoint hold plugins: ["game"] (a JSON list); resuming re-imports it
    gspo(folder, "train", *SMALL, "--plugin", "game", "--task", "game", "--train-file",
         "rows.jsonl", "--steps", "3", "--stop-after", "1", "--output-dir", "run")  # fmt: skip
    proc = gspo(folder, "train", "--output-dir", "run", "--resume", "--progress", "false")
    assert "resuming run at step 1 of 3" in proc.stdout
    assert len([m for m in metrics(folder / "run") if "reward/mean" in m]) == 3
