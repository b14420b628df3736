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
