"""The private Ray a run starts keeps its files in a temporary folder of its own: it is removed
on every exit, also one that skips the shutdown (an error, a second Ctrl-C) or a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

START = (
    "import sys, time\n"
    "from gspo.backend import ray_cluster\n"
    "ray_cluster.start_ray(None, num_cpus=1)\n"
    "print(ray_cluster._SESSION['remove'], flush=True)\n"
    "if sys.argv[1] == 'raise':\n"
    "    raise SystemExit(3)  # leaves without stop_ray\n"
    "time.sleep(600)\n"
)


def start(how: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", START, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline().strip()
    assert line, "Ray did not start"
    folder = Path(line)
    assert folder.is_dir()
    return proc, folder


def gone_within(folder: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds  # an upper bound only: it passes as soon as it is gone
    while time.monotonic() < deadline:
        if not folder.exists():
            return True
        time.sleep(0.1)
    return False


def test_exit_without_shutdown_removes_the_temp_dir():
    proc, folder = start("raise")
    assert proc.wait(timeout=120) == 3
    assert not folder.exists()


def test_sigkill_leaves_the_temp_dir_to_the_watchdog():
    proc, folder = start("sleep")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert gone_within(folder, 90)


def test_ctrl_c_to_a_ray_run_checkpoints_and_leaves_no_temp_dir(tmp_path):
    """Ctrl-C in a terminal signals the whole process group: the driver stops after the step
    with a checkpoint, Ray's processes (which block SIGINT) are shut down, and its folder goes."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="gspo-t", dir="/tmp"))  # short: Ray's socket paths
    out = tmp_path / "run"
    args = [
        sys.executable, "-m", "gspo.interface.cli", "train", "--preset", "smoke", "--backend", "ray",
        "--trainer-workers", "1", "--rollout-workers", "1", "--steps", "30",
        "--checkpoint-every", "1", "--threads", "1", "--output-dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("GSPO_RAY_TEMP_DIR", None)
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "step_000002").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        assert list(tmp.glob("gspo-ray-*")), "the run made no private Ray folder"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-3000:]
        assert "Traceback" not in err
        assert f"resume with: gspo train --output-dir {out} --resume" in err
        assert list(tmp.glob("gspo-ray-*")) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
