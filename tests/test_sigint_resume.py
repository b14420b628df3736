"""Ctrl-C (SIGINT) and SIGTERM stop a run after the current step with a checkpoint and one line
naming it and the resume command; `--resume` then continues exactly; a second Ctrl-C quits at
once. `gspo demo` resumes from SFT or RL the same way.

Each signal is sent while a checkpoint write is paused (GSPO_FAULT_CHECKPOINT_DELAY_S), as in
tests/test_kill_resume.py, so where it lands does not depend on timing: the run is mid-step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cold_start import ADDITION_D64

from gspo.core.checkpoint_paths import checkpoint_root, latest_checkpoint, list_checkpoints
from gspo.interface.cli import main
from gspo.orchestration.logging import read_metrics

pytestmark = pytest.mark.slow  # runs gspo in fresh processes: tens of seconds

TIMING = ("time/", "throughput/")
STEPS = 5
TINY = [
    "--model",
    str(ADDITION_D64),  # a cold start: varied rewards, so the weights move every step
    "--task",
    "addition",
    "--n-train",
    "64",
    "--n-test",
    "8",
    "--prompts-per-step",
    "2",
    "--group-size",
    "4",
    "--max-new-tokens",
    "6",
    "--num-minibatches",
    "2",
    "--eval-every",
    "0",
    "--lr",
    "1e-3",
    "--checkpoint-every",
    "1",
    "--progress",
    "false",
    "--device",
    "cpu",
    "--threads",
    "1",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def gspo(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gspo.interface.cli", *args],
        env={**ENV, **kw.pop("env", {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def wait_for_write(proc: subprocess.Popen, root: Path) -> None:
    """Until a checkpoint write is under way in ``root`` (its temporary folder exists)."""
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if root.is_dir() and any(p.name.startswith(".tmp-") for p in root.iterdir()):
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint write seen in {root}: {proc.communicate()}")


def interrupt_mid_write(args: list[str], root: Path, signum=signal.SIGINT) -> tuple[int, str]:
    """Run ``gspo args`` with slow checkpoint writes, send ``signum`` during one; (rc, stderr)."""
    proc = gspo(*args, env={"GSPO_FAULT_CHECKPOINT_DELAY_S": "2"})
    wait_for_write(proc, root)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out + err


def assert_no_temporaries(folder: Path) -> None:
    left = [p for p in folder.rglob(".*") if p.name.startswith((".tmp", ".latest"))]
    assert left == []


def test_sigint_checkpoints_then_resume_equals_unbroken_run(tmp_path):
    unbroken, out = tmp_path / "unbroken", tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        code = main(["train", *TINY, "--steps", str(STEPS), "--output-dir", str(unbroken)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0

    train = ["train", *TINY, "--steps", str(STEPS), "--output-dir", str(out)]
    rc, text = interrupt_mid_write(train, checkpoint_root(out))
    assert rc == 128 + signal.SIGINT and "Traceback" not in text
    stopped = [line for line in text.splitlines() if "stopped by SIGINT" in line]
    assert len(stopped) == 1, text
    step = latest_checkpoint(out)
    assert f"checkpoint {step}" in stopped[0]
    assert stopped[0].endswith(f"resume with: gspo train --output-dir {out} --resume")
    assert 1 <= int(step.name.removeprefix("step_")) < STEPS
    assert_no_temporaries(out)

    proc = gspo("train", "--output-dir", str(out), "--resume")
    text = "".join(proc.communicate(timeout=300))
    assert proc.returncode == 0, text
    assert "| 1-1 |" in text  # the table covers the whole run, from step 1
    got = comparable(read_metrics(out / "metrics.jsonl"))
    want = comparable(read_metrics(unbroken / "metrics.jsonl"))
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert got == want
    assert any(r.get("reward/std", 0) > 0 for r in want)


def test_sigterm_stops_the_same_way(tmp_path):
    out = tmp_path / "run"
    train = ["train", *TINY, "--steps", str(STEPS), "--output-dir", str(out)]
    rc, text = interrupt_mid_write(train, checkpoint_root(out), signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM and "Traceback" not in text
    assert "stopped by SIGTERM" in text and f"gspo train --output-dir {out} --resume" in text
    assert latest_checkpoint(out) is not None


def test_second_sigint_quits_at_once_without_traceback(tmp_path):
    out = tmp_path / "run"
    root = checkpoint_root(out)
    proc = gspo(
        "train",
        *TINY,
        "--steps",
        str(STEPS),
        "--output-dir",
        str(out),
        env={"GSPO_FAULT_CHECKPOINT_DELAY_S": "30"},
    )
    wait_for_write(proc, root)
    proc.send_signal(signal.SIGINT)
    # The first one is acknowledged before the second is sent (two pending SIGINTs are one).
    first = proc.stderr.readline()
    while "stopping after the current step" not in first:
        assert first, "the run ended without acknowledging SIGINT"
        first = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=25)  # well before the 30 s write would end
    assert proc.returncode == 128 + signal.SIGINT
    assert "Traceback" not in err
    assert "gspo train: interrupted (SIGINT)" in err and "no checkpoint was written" in err
    assert list_checkpoints(out) == []  # the interrupted write left nothing half done
    assert_no_temporaries(out)


def test_demo_resumes_after_sigint_in_sft_and_in_rl(tmp_path):
    demo = ["--sft-steps", "4", "--steps", "3", "--checkpoint-every", "2", "--threads", "1"]
    demo += ["--progress", "false"]
    unbroken, out = tmp_path / "unbroken", tmp_path / "demo"
    threads = torch.get_num_threads()
    try:
        assert main(["demo", *demo, "--output-dir", str(unbroken)]) == 0
    finally:
        torch.set_num_threads(threads)

    resume = f"resume with: gspo demo --output-dir {out} --resume"
    # A stop in SFT (during its step-2 checkpoint write) ...
    rc, text = interrupt_mid_write(
        ["demo", *demo, "--output-dir", str(out)], out / "sft" / "checkpoints"
    )
    assert rc == 130 and "Traceback" not in text
    assert "stopped by SIGINT after SFT step 2" in text and resume in text
    # ... then one in RL (during its step-2 checkpoint write) ...
    rc, text = interrupt_mid_write(
        ["demo", "--output-dir", str(out), "--resume"], out / "rl" / "checkpoints"
    )
    assert rc == 130 and "Traceback" not in text
    assert "stopped by SIGINT after RL step" in text and resume in text
    assert_no_temporaries(out)
    # ... and running it again, as it was first typed, finishes what an unbroken demo does.
    proc = gspo("demo", "--output-dir", str(out))
    text = "".join(proc.communicate(timeout=300))
    assert proc.returncode == 0, text
    assert f"continuing the unfinished demo in {out}" in text
    got = json.loads((out / "summary.json").read_text())
    want = json.loads((unbroken / "summary.json").read_text())
    assert got["sft"]["final_loss"] == want["sft"]["final_loss"]
    assert comparable([got["before"], got["after"]]) == comparable([want["before"], want["after"]])
    rows = comparable(read_metrics(out / "rl" / "metrics.jsonl"))
    assert rows == comparable(read_metrics(unbroken / "rl" / "metrics.jsonl"))
    # A finished demo is a run like any other: a new one into its folder is refused.
    proc = gspo("demo", "--output-dir", str(out))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "already holds a run" in err and "Traceback" not in err
