"""The sandbox against runs outliving their callers (its second attack round, issue 34,
class 3): a caller that stops waiting, or is interrupted while waiting, kills its runs, and
the cgroups of dead callers are swept; live runs never outnumber the workers. Each asserts
what is observed of the runs' processes, not what the sandbox reports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sandbox_support import (
    ex,
    needs_full_isolation,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.envs.rewards import score
from gspo.envs.tasks.base import Example
from gspo.sandbox import (
    SandboxConfig,
    code_reward,
    with_timeout,
)
from gspo.sandbox.slots import live_runs, processes_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
# A uid range of this test process's own (other suites may run sandboxes at the same time),
# so "no process of these uids is alive" means "none of ours is".
PRIVATE_BASE_UID = 64000 + (os.getpid() % 400) * 8
PRIVATE_SLOTS = 8


# --------------------------------------------------------------------------------------------
# 3: no orphans; live runs never outnumber the workers
# --------------------------------------------------------------------------------------------

SLEEPER = "```python\nimport time\ndef f(x):\n    time.sleep(1000)\n```"


def private_reward(completion: str, example: Example) -> float:
    config = SandboxConfig(base_uid=PRIVATE_BASE_UID, uid_slots=PRIVATE_SLOTS)
    return code_reward(completion, example, config=config)


def live_processes() -> list[int]:
    return [p for i in range(PRIVATE_SLOTS) for p in processes_of(PRIVATE_BASE_UID + i)]


@pytest.mark.slow
def test_runs_end_when_their_caller_stops_waiting() -> None:
    needs_full_isolation()
    live_runs(reset_peak=True)
    rewards, errors = score(
        private_reward, [SLEEPER] * 6, [ex(tests=["assert f(1)"])] * 6, timeout_s=1.0, workers=2
    )
    assert rewards == [0.0] * 6 and errors == 6
    now, peak = live_runs()
    assert now == 0 and peak <= 2, (now, peak)
    assert live_processes() == [], "a run outlived its caller"


def test_runs_end_when_the_waiting_caller_is_interrupted(request) -> None:
    """A cancelled Ray task raises KeyboardInterrupt in the thread that waits."""
    needs_full_isolation()
    # Python's own SIGINT handler, whatever an earlier test of this process left installed
    # (in the whole suite the signal was once swallowed: the call returned after it was sent).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    bounded = with_timeout(private_reward, 600.0)
    # Up to three tries: on a loaded machine a run can end (its slot busy, say) before the
    # watcher sees it running; the test is about a run interrupted while it runs.
    for _ in range(3):
        seen, done = threading.Event(), threading.Event()

        def interrupt_once_running(seen=seen, done=done) -> None:
            while not done.is_set():
                if live_processes():
                    seen.set()
                    os.kill(os.getpid(), signal.SIGINT)  # a real signal: it wakes the caller
                    return
                time.sleep(0.02)

        watcher = threading.Thread(target=interrupt_once_running, daemon=True)
        start = time.monotonic()
        try:
            watcher.start()
            try:
                bounded(SLEEPER, ex(tests=["assert f(1)"]))
            finally:
                done.set()
                watcher.join()
            # The call returned: the signal must not have been sent while it ran.
            assert not seen.is_set(), "the caller was interrupted but did not raise"
        except KeyboardInterrupt:
            break
    else:
        pytest.fail("the sleeping run was never seen running in three tries")
    # Interrupted, not ended by itself (its wall-clock backstop is 25 s per test).
    assert time.monotonic() - start < 20
    assert live_runs()[0] == 0 and live_processes() == []


def test_cgroups_of_dead_callers_are_swept(tmp_path: Path) -> None:
    """A caller killed outright leaves its runs' empty cgroups behind; the next one removes
    them (and only those of callers that are gone)."""
    from gspo.sandbox.cgroup import Backend, sweep_stale

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"gspo-sandbox-{dead.pid}-0-abcd"
    ours = tmp_path / f"gspo-sandbox-{os.getpid()}-0-abcd"
    other = tmp_path / "unrelated"
    for path in (stale, ours, other):
        path.mkdir()
    sweep_stale(Backend("v2", (str(tmp_path),)))
    assert not stale.exists() and ours.exists() and other.exists()


@pytest.mark.slow
def test_tool_calls_that_time_out_leave_no_run_alive() -> None:
    # Four steps of a python tool call that sleeps: each run is killed when its call times
    # out, not left to its own wall-clock backstop (once 55 s, holding a uid and memory).
    from gspo.envs.tools import ToolFailure, python_tool, run_tool

    needs_full_isolation()
    tool = python_tool(timeout_s=5.0)
    for _ in range(4):
        with pytest.raises(ToolFailure):
            run_tool(tool, "import time\ntime.sleep(600)", 1.0)
        assert live_runs()[0] == 0
