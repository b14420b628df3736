"""The Ray watchdog's reaping, without Ray: a process recorded before the driver died and the
child it started after the last record are both killed (the CI flake of a worker born in the
watchdog's last 0.5 s poll window)."""

import os
import subprocess
import sys
import time

import pytest

from gspo.backend import ray_watchdog

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the watchdog reads /proc")

# A parent that, once told on stdin, starts a sleeping child and prints its pid.
PARENT = (
    "import subprocess, sys, time\n"
    "sys.stdin.readline()\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def _alive(pid: int) -> bool:
    info = ray_watchdog._stat(pid)
    return info is not None


def test_reap_kills_a_child_started_after_the_last_record():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        recorded = {parent.pid: ray_watchdog._stat(parent.pid)[1]}  # the last record
        parent.stdin.write("go\n")
        parent.stdin.flush()
        child = int(parent.stdout.readline())  # born after the record
        assert child not in recorded and _alive(child)
        reaped = ray_watchdog.reap(recorded, skip=os.getpid())
        assert set(reaped) == {parent.pid, child}
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10  # the child is reparented, then reaped by init
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
