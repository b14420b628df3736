"""Helpers shared by the sandbox test files, in one module (imported by name: pytest puts
tests/ on sys.path). A test file that imports ``no_leftovers`` gets it as an autouse fixture.

* :func:`leftovers` finds processes that outlived the runs a test started, and only those:
  other checkouts' test suites and trainers may run sandboxes on the same machine at the
  same time, in the same uid range.
* :func:`needs` skips a test whose requirement (root, namespaces, a cgroup, an interpreter)
  this machine lacks, with a reason that names it. CI sets ``GSPO_SANDBOX_TESTS_REQUIRED=1``
  (.ci/run): there, running as root on the project's machines, a missing requirement fails
  the test instead, so these tests cannot silently stop running.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from gspo.envs.tasks.base import Example
from gspo.sandbox import SandboxConfig, isolation, run_python, seccomp
from gspo.sandbox.slots import processes_of, run_history

REQUIRED_ENV = "GSPO_SANDBOX_TESTS_REQUIRED"
ROOT = os.geteuid() == 0
SYSTEM_PYTHON = "/usr/bin/python3"
MACHINE = os.uname().machine

# Slack on top of a time limit: process start-up and teardown on a loaded 2-core machine.
SLACK_S = 3.0

# What a root caller on Linux must get (CI runs as root): with it, each test's conditional
# assertions ("if iso.network_blocked") always run, so a missing mechanism fails them.
FULL_ISOLATION = {
    "uid",
    "nproc",
    "no_new_privs",
    "mountns",
    "netns",
    "pidns",
    "ipcns",
    "utsns",
    "seccomp",
    "keyring",
}

# A ctypes syscall(2) for programs in the sandbox: call(nr, *args) -> (result, errno).
SYSCALL = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
"""


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


def needs_seccomp() -> None:
    needs(MACHINE in seccomp.AUDIT_ARCH, f"the seccomp filter is for x86_64/aarch64, not {MACHINE}")


def needs_full_isolation(*more: str) -> None:
    """Root, the seccomp filter's architecture, every mechanism of :data:`FULL_ISOLATION` and
    ``more`` (e.g. ``"cgroup"``)."""
    needs_root()
    needs_seccomp()
    missing = (FULL_ISOLATION | set(more)) - isolation().mechanisms
    needs(not missing, f"needs {sorted(missing)} (missing: {isolation().missing})")


@pytest.fixture(scope="module")
def iso():
    found = isolation()
    if ROOT:
        needs(
            found.mechanisms >= FULL_ISOLATION,
            f"needs namespaces and seccomp as root (a container without CAP_SYS_ADMIN lacks "
            f"them); missing: {found.missing}",
        )
    return found


def ex(prompt: str = "", **meta: object) -> Example:
    return Example(prompt=prompt, answer="", meta=dict(meta))


def inside(code: str, **config: object) -> dict:
    """Run ``code`` (which prints one JSON object last) in the sandbox; return that object."""
    result = run_python(textwrap.dedent(code), config=SandboxConfig(timeout_s=20, **config))
    assert result.ok, (result.returncode, result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


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


@pytest.fixture(autouse=True)
def no_leftovers():
    # Scoped to the runs this test started: other suites may run sandboxes meanwhile.
    mark = history_mark()
    yield
    assert leftovers(mark) == [], "a sandboxed process outlived its run"
