"""Helpers shared by the sandbox test files (imported by name: pytest puts tests/ on sys.path).

* :func:`leftovers` finds processes that outlived the runs a test started, and only those:
  other checkouts' test suites and trainers may run sandboxes on the same machine at the
  same time, in the same uid range.
* :func:`needs` skips a test whose requirement (root, namespaces, a cgroup, an interpreter)
  this machine lacks, with a reason that names it. CI sets ``GSPO_SANDBOX_TESTS_REQUIRED=1``
  (.ci/run): there, running as root on the project's machines, a missing requirement fails
  the test instead, so these tests cannot silently stop running.
"""

from __future__ import annotations

import os

import pytest

from gspo.envs.sandbox.slots import processes_of, run_history

REQUIRED_ENV = "GSPO_SANDBOX_TESTS_REQUIRED"
ROOT = os.geteuid() == 0
SYSTEM_PYTHON = "/usr/bin/python3"


def needs(condition: bool, reason: str) -> None:
    """Skip (or, in CI, fail) unless ``condition`` holds; ``reason`` names what is missing."""
    if condition:
        return
    if os.environ.get(REQUIRED_ENV):
        pytest.fail(f"{reason} ({REQUIRED_ENV} is set: CI must run this test)")
    pytest.skip(reason)


def needs_root() -> None:
    needs(ROOT, "needs root: dedicated sandbox uids, namespaces and cgroups are set up as root")


def needs_system_python() -> None:
    needs(os.path.exists(SYSTEM_PYTHON), f"needs the system interpreter {SYSTEM_PYTHON}")


def history_mark() -> int:
    """Where the run history stands now; pass it to :func:`leftovers` afterwards."""
    return len(run_history())


def _start_time_s(pid: int) -> float | None:
    """A process's start time in seconds since boot (CLOCK_BOOTTIME), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime); fields after the command's closing parenthesis start at 3.
    return int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


def leftovers(mark: int) -> list[tuple[int, int]]:
    """(uid, pid) of live processes started by a run finished since ``mark`` in this
    process: a process of the run's uid that started while the run held that uid."""
    windows = run_history()[mark:]
    found = []
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    for uid in {w[0] for w in windows}:
        for pid in processes_of(uid):
            start = _start_time_s(pid)
            if start is None:
                continue
            if any(u == uid and a - tick <= start <= b + tick for u, a, b in windows):
                found.append((uid, pid))
    return found
