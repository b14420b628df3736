"""The sandbox's memory and task bounds from its hardening round: memory outside the
per-process limits (memfd, shared memory, tmpfs, many processes) is bounded, a run's cgroup
bounds its memory and tasks by itself, and the cgroup v2 files are right on a stand-in
hierarchy. Split from test_sandbox_hardening; tests that need root or a cgroup skip with a
reason (and fail in CI, see sandbox_support).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_support import (
    inside,
    needs,
    needs_full_isolation,
    needs_root,
    needs_seccomp,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.sandbox import (
    SandboxConfig,
    run_python,
)
from gspo.sandbox.cgroup import detect as detect_cgroup

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def needs_cgroup() -> None:
    needs_root()
    backend, why = detect_cgroup()
    needs(backend is not None, f"needs a writable cgroup (v2 delegated or v1 memory+pids): {why}")


# --------------------------------------------------------------------------------------------
# Memory outside the per-process limits
# --------------------------------------------------------------------------------------------

MEMORY_ROUTES = """
import ctypes, errno, json, mmap, os
MB = 1 << 20
libc = ctypes.CDLL(None, use_errno=True)
out = {}
try:
    fd = os.memfd_create("hog"); os.ftruncate(fd, 256 * MB)
    m = mmap.mmap(fd, 256 * MB); m.write(b"x" * (256 * MB)); out["memfd"] = "held"
except OSError as e:
    out["memfd"] = errno.errorcode[e.errno]
held = 0
try:
    with open("/dev/shm/hog", "wb") as f:
        for _ in range(256):
            f.write(b"x" * MB); f.flush(); held += 1
except OSError as e:
    pass
out["dev_shm_mb"] = held
os.remove("/dev/shm/hog")
shmid = libc.shmget(0, ctypes.c_size_t(256 * MB), 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
out["sysv_shm"] = "held" if shmid >= 0 else errno.errorcode[ctypes.get_errno()]
r = libc.unshare(0x10000000 | 0x20000)  # a user + mount namespace to mount a tmpfs in
out["userns_for_tmpfs"] = "made" if r == 0 else errno.errorcode[ctypes.get_errno()]
r = libc.mount(b"none", b"/tmp", b"tmpfs", 0, b"size=4g")
out["mount_tmpfs"] = "mounted" if r == 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(out))
"""


def test_memory_outside_process_limits_is_bounded() -> None:
    """memfd, SysV shm, a fresh tmpfs: refused; /dev/shm: within the run's 64 MB tmpfs."""
    needs_seccomp()
    needs_full_isolation()
    seen = inside(MEMORY_ROUTES, memory_mb=512, tmpfs_mb=64)
    assert seen["memfd"] == "EPERM" and seen["sysv_shm"] == "EPERM"
    assert seen["userns_for_tmpfs"] == "EPERM" and seen["mount_tmpfs"] == "EPERM"
    assert seen["dev_shm_mb"] < 64


MANY_PROCESSES = """
import os, sys, time
MB = 1 << 20
children = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        hog = b"x" * (60 * MB)  # touched: resident, within each process's RLIMIT_AS
        print("held", i, flush=True)
        time.sleep(3)
        os._exit(0)
    children.append(pid)
codes = [os.waitpid(pid, 0)[1] for pid in children]
print("statuses", codes, flush=True)
"""


@pytest.mark.slow
def test_run_memory_is_bounded_by_its_cgroup() -> None:
    """Four processes of 60 MB each fit their RLIMIT_AS but not the run's 128 MB cgroup."""
    needs_cgroup()
    result = run_python(
        MANY_PROCESSES,
        config=SandboxConfig(timeout_s=20, memory_mb=256, run_memory_mb=128, max_processes=8),
    )
    # Some child was stopped (killed by the cgroup's OOM killer, or failed to allocate).
    assert (
        result.stdout.count("held") < 4
        or "statuses" not in result.stdout
        or any(code != 0 for code in json.loads(result.stdout.split("statuses", 1)[1].strip()))
    ), result.stdout
    assert result.memory_limit and "cgroup" in result.isolation.mechanisms
    # The same program with room to spare runs to the end.
    roomy = run_python(
        MANY_PROCESSES,
        config=SandboxConfig(timeout_s=20, memory_mb=256, run_memory_mb=512, max_processes=8),
    )
    assert roomy.ok and roomy.stdout.count("held") == 4 and not roomy.memory_limit, roomy.stderr


JOIN_AND_FORK = """
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
n = 0
for _ in range(32):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n, flush=True)
"""


@pytest.mark.slow
def test_run_cgroup_bounds_tasks_by_itself() -> None:
    """pids.max of a run's cgroup, alone (in a run RLIMIT_NPROC applies as well): a root
    process in a cgroup with pids.max 4 starts 3 children, then fork fails."""
    needs_cgroup()
    from gspo.sandbox.cgroup import RunCgroup

    backend, _ = detect_cgroup()
    cgroup = RunCgroup(backend, 256 << 20, 4)
    try:
        # The pids hierarchy (v1: after memory) or the one cgroup (v2).
        procs_file = cgroup.procs_files[len(backend.parents) - 1]
        out = subprocess.run(
            [sys.executable, "-I", "-S", "-c", JOIN_AND_FORK, procs_file],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.stdout.strip() == "3", out.stderr
    finally:
        assert cgroup.kill_all()
        cgroup.remove()
    assert not any(os.path.exists(d) for d in cgroup.dirs)


def test_cgroup_v2_files_on_a_stand_in_hierarchy(tmp_path: Path, monkeypatch) -> None:
    """The v2 backend's file protocol (this project's machines have controllers on v1 only,
    so the real v2 path cannot run here): detection through mountinfo and /proc/self/cgroup,
    enabling memory+pids for children, the limits written, and removal."""
    from gspo.sandbox import cgroup as sandbox_cgroup

    root = tmp_path / "cgroup2"
    own = root / "trainer.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("cpu\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n")
    self_cgroup = tmp_path / "cgroup"
    self_cgroup.write_text("0::/trainer.scope\n")
    monkeypatch.setattr(sandbox_cgroup, "_MOUNTINFO", str(mountinfo))
    monkeypatch.setattr(sandbox_cgroup, "_SELF_CGROUP", str(self_cgroup))
    monkeypatch.setattr(sandbox_cgroup, "_detected", {})
    backend, why = sandbox_cgroup.detect()
    assert backend == sandbox_cgroup.Backend("v2", (str(own),)) and why == ""
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"
    run = sandbox_cgroup.RunCgroup(backend, 256 << 20, 10)
    (child,) = run.dirs
    assert Path(child).parent == own and Path(child).name.startswith("gspo-sandbox-")
    assert (Path(child) / "memory.max").read_text() == str(256 << 20)
    assert (Path(child) / "pids.max").read_text() == "10"
    assert run.procs_files == [f"{child}/cgroup.procs"] and run.pids() == []
    (Path(child) / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert run.memory_limit_hit()
    for f in Path(child).iterdir():  # cgroupfs drops its files itself on rmdir
        f.unlink()
    run.remove()
    assert not Path(child).exists()
    # A parent without the controllers to give: no backend, and the reason.
    (own / "cgroup.controllers").write_text("cpu\n")
    monkeypatch.setattr(sandbox_cgroup, "_detected", {})
    monkeypatch.setattr(sandbox_cgroup, "_own_paths", lambda: {"": "/trainer.scope"})
    backend, why = sandbox_cgroup.detect()
    assert backend is None and "not memory+pids" in why
