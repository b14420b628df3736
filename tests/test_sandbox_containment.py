"""The sandbox against its second attack round: one test per escaped class (issue 34).

1. sockets of other address families (AF_VSOCK...): an allow list of families;
2. CPU sabotage across runs (setsid spinners, a spinning atexit): per-run CPU share, quota
   and CPU-time limit, and a run that did not exit by itself earns nothing;
3. runs outliving their callers: a caller that stops waiting kills its runs (in
   test_sandbox_orphans);
4. the interpreter's prefix bound whole (``~/.local/bin/python3.X``);
5. a distribution's dist-packages importable under another interpreter;
6. host-wide kernel pools (AIO contexts, message queues...);
7. the host's uevents (netlink);
8. inotify on the bound directories;
9. flock / fcntl locks on the shared bound files as a channel between runs;
and the load test: per-test limits in CPU time, so a correct solution does not fail on a busy
machine. Each asserts what the program observes from inside the sandbox.
"""

from __future__ import annotations

import errno
import functools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sandbox_support import (
    MACHINE,
    ex,
    inside,
    needs,
    needs_full_isolation,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.envs.rewards import score
from gspo.sandbox import (
    SandboxConfig,
    code_reward,
    run_python,
    seccomp,
)
from gspo.sandbox.interpreter import system_package_dirs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def needs_cpu_cgroup() -> None:
    needs_full_isolation()
    result = run_python("pass", config=SandboxConfig(timeout_s=20))
    needs(result.cpu_s is not None, "needs a cgroup CPU controller (v2 cpu or v1 cpu+cpuacct)")


SYSCALL = """
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return errno.errorcode.get(ctypes.get_errno(), "ok") if r < 0 else "ok"
def sock(*args):
    try:
        socket.socket(*args).close()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
"""

ALLOW, EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
EAFNOSUPPORT = 0x00050000 | errno.EAFNOSUPPORT


# --------------------------------------------------------------------------------------------
# 1, 7: socket families are an allow list; no netlink, so no uevents
# --------------------------------------------------------------------------------------------


def test_seccomp_program_allows_only_unix_sockets_and_no_locks() -> None:
    """The BPF program, interpreted on both architectures: every family but AF_UNIX refused
    (all 0..63 tried, not a list of known-dangerous ones), fcntl's lock commands refused and
    its other commands allowed."""
    for machine, arch in seccomp.AUDIT_ARCH.items():
        program = seccomp.build_filter(machine)
        assert program is not None
        for nr in (seccomp.SOCKET[machine], seccomp.SOCKETPAIR[machine]):
            assert seccomp.run_filter(program, nr, arch, 1) == ALLOW  # AF_UNIX
            for family in range(2, 64):
                assert seccomp.run_filter(program, nr, arch, family) == EAFNOSUPPORT, family
            assert seccomp.run_filter(program, nr, arch, 0x100000001) == ALLOW  # int argument
        fcntl = seccomp.FCNTL[machine]
        for cmd in seccomp.DENIED_FCNTL_COMMANDS.values():
            assert seccomp.run_filter(program, fcntl, arch, 3, cmd) == EPERM, cmd
        for cmd in (0, 1, 2, 3, 4, 1030):  # F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, ...
            assert seccomp.run_filter(program, fcntl, arch, 3, cmd) == ALLOW, cmd


def test_sockets_other_than_unix_are_refused_inside() -> None:
    needs_full_isolation()
    seen = inside(
        SYSCALL
        + """
out = {name: sock(family, socket.SOCK_STREAM) for name, family in
       (("inet", 2), ("inet6", 10), ("vsock", 40), ("alg", 38), ("rds", 21), ("tipc", 30))}
out["vsock_dgram"] = sock(40, socket.SOCK_DGRAM)
out["packet"] = sock(17, socket.SOCK_RAW, 0)
out["netlink_route"] = sock(16, socket.SOCK_RAW, 0)
out["unix"] = sock(socket.AF_UNIX, socket.SOCK_STREAM)
a, b = socket.socketpair()
a.sendall(b"x")
out["socketpair"] = b.recv(1).decode()
print(json.dumps(out))
"""
    )
    assert seen.pop("unix") == "ok" and seen.pop("socketpair") == "x"
    assert set(seen.values()) == {"EAFNOSUPPORT"}, seen


def test_host_uevents_are_not_delivered() -> None:
    """NETLINK_KOBJECT_UEVENT would deliver the host's device events into the run."""
    needs_full_isolation()
    seen = inside(
        SYSCALL
        + """
try:
    s = socket.socket(16, socket.SOCK_DGRAM, 15)  # AF_NETLINK, NETLINK_KOBJECT_UEVENT
    s.bind((0, 1))  # the kernel's uevent multicast group
    out = "subscribed"
except OSError as e:
    out = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({"uevent": out}))
"""
    )
    assert seen == {"uevent": "EAFNOSUPPORT"}


# --------------------------------------------------------------------------------------------
# 6, 8, 9: host-wide pools, inotify, locks on shared files
# --------------------------------------------------------------------------------------------


def test_host_wide_kernel_pools_are_refused() -> None:
    """io_setup takes from the host's one AIO pool (fs.aio-max-nr); the others are pools or
    host-wide objects of the same kind."""
    needs_full_isolation()
    nr = seccomp.denied_syscalls(MACHINE)
    calls = {
        "io_setup": (nr["io_setup"], 1, "ctypes.addressof(ctx)"),
        "io_uring_setup": (nr["io_uring_setup"], 1, "ctypes.addressof(params)"),
        "mq_open": (nr["mq_open"], "ctypes.addressof(name)", 0o100 | 2, 0o600, 0),
        "semget": (nr["semget"], 0, 1, 0o1600),
        "msgget": (nr["msgget"], 0, 0o1600),
        "shmget": (nr["shmget"], 0, 4096, 0o1600),
        "keyctl": (nr["keyctl"], 0, -3),
        "userfaultfd": (nr["userfaultfd"], 0),
        "perf_event_open": (nr["perf_event_open"], 0, 0, -1, -1, 0),
        "bpf": (nr["bpf"], 0, 0, 0),
        "fanotify_init": (nr["fanotify_init"], 0, 0),
    }
    lines = [
        "ctx = ctypes.c_ulong(0)",
        "params = ctypes.create_string_buffer(120)",
        'name = ctypes.create_string_buffer(b"/gspo-probe")',
        "out = {}",
    ]
    for name, (number, *args) in calls.items():
        lines.append(f"out[{name!r}] = call({number}, {', '.join(map(str, args))})")
    seen = inside(SYSCALL + "\n".join(lines) + "\nprint(json.dumps(out))\n")
    assert seen == dict.fromkeys(calls, "EPERM"), seen


def test_inotify_and_dnotify_are_refused() -> None:
    needs_full_isolation()
    seen = inside(
        SYSCALL
        + f"""
import fcntl
out = {{"inotify_init1": call({seccomp.denied_syscalls(MACHINE)["inotify_init1"]}, 0)}}
if {MACHINE == "x86_64"}:
    out["inotify_init"] = call(253)
out["inotify_add_watch"] = call({seccomp.denied_syscalls(MACHINE)["inotify_add_watch"]}, 0, 0, 0)
fd = os.open("/usr", os.O_RDONLY)
try:
    fcntl.fcntl(fd, 1026, 0x1 | 0x80000000)  # F_NOTIFY, DN_ACCESS | DN_MULTISHOT
    out["dnotify"] = "ok"
except OSError as e:
    out["dnotify"] = errno.errorcode[e.errno]
print(json.dumps(out))
"""
    )
    assert set(seen.values()) == {"EPERM"}, seen


def test_locks_on_shared_files_are_refused() -> None:
    """flock and fcntl record locks on the read-only files bound from the host would be seen
    by every other run (a covert channel); reading lock state (F_GETLK) too."""
    needs_full_isolation()
    seen = inside(
        """
    import errno, fcntl, json, os, struct
    out = {}
    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except OSError as e:
            out[name] = errno.errorcode[e.errno]
    f = open("/etc/ld.so.cache", "rb")
    attempt("flock_sh", lambda: fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB))
    attempt("lockf", lambda: fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB))
    lock = struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 0, 0, 0)
    for name, cmd in (("setlk", 6), ("setlkw", 7), ("getlk", 5), ("ofd_setlk", 37),
                      ("ofd_getlk", 36)):
        attempt(name, lambda cmd=cmd: fcntl.fcntl(f, cmd, lock))
    # What stays: the other fcntl commands, and files of its own.
    out["getfl"] = fcntl.fcntl(f, fcntl.F_GETFL) & 3
    print(json.dumps(out))
    """
    )
    assert seen.pop("getfl") == os.O_RDONLY
    assert set(seen.values()) == {"EPERM"}, seen


# --------------------------------------------------------------------------------------------
# 4, 5: only what the interpreter imports from is bound
# --------------------------------------------------------------------------------------------


def test_interpreter_prefix_is_not_bound_whole(tmp_path: Path) -> None:
    """An interpreter reached as ``~/.local/bin/python3.X`` (uv, pipx): the rest of
    ``~/.local`` (files, user site-packages) must not be visible inside."""
    needs_full_isolation()
    local = tmp_path / "home" / ".local"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (local / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(sys.executable), local / "bin" / version)
    (local / "secret.txt").write_text("token")
    user_site = local / "lib" / version / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "gspo_user_site_probe.py").write_text("VALUE = 1\n")
    code = f"""
    import json, os, sys
    out = {{"secret": os.path.exists({str(local / "secret.txt")!r}),
            "local": os.path.exists({str(local)!r})}}
    sys.path.append({str(user_site)!r})
    try:
        import gspo_user_site_probe
        out["user_site"] = "imported"
    except ImportError:
        out["user_site"] = "absent"
    import json as _j, decimal, ctypes  # the standard library, lib-dynload included, works
    print(json.dumps(out))
    """
    seen = inside(code, python=str(local / "bin" / version))
    assert seen == {"secret": False, "local": False, "user_site": "absent"}


def test_distribution_packages_are_hidden_under_any_interpreter() -> None:
    """The distribution's Python packages under ``/usr`` must not import, whichever
    interpreter runs (pyenv, uv, conda have their own prefix; the distribution's own): each
    directory is absent inside, or hidden under an empty mount where its parent is bound."""
    needs_full_isolation()
    found = system_package_dirs()
    needs(found != [], "needs a distribution package directory (e.g. /usr/lib/python3/...)")
    code = f"""
    import json, os
    print(json.dumps({{p: os.listdir(p) if os.path.isdir(p) else [] for p in {found!r}}}))
    """
    for python in {sys.executable, "/usr/bin/python3"}:
        if os.path.exists(python):
            assert inside(code, python=python) == {path: [] for path in found}, python


# --------------------------------------------------------------------------------------------
# 2: CPU sabotage; a run's reward does not depend on its neighbours
# --------------------------------------------------------------------------------------------

# Correct, then sabotages: setsid spinners left behind and a spin at exit. Their CPU time
# counts against its own tests (the run's cgroup counter) and they die with its run (the
# judge kills its pid namespace), so whatever it scores, the runs beside it lose nothing.
SABOTEUR = """```python
import atexit, os
def f(x):
    return 2 * x
for _ in range(5):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
def spin():
    while True:
        pass
atexit.register(spin)
```"""
# Correct and honest, with about 0.4 s of CPU work per test (on this project's machine).
HONEST = """```python
def f(x):
    total = 0
    for i in range(6_000_000):
        total += i & 1
    return 2 * x + (total - 3_000_000)
```"""
TESTS = ex(tests=["assert f(2) == 4", "assert f(3) == 6"])


def test_reward_does_not_depend_on_what_runs_beside_it() -> None:
    needs_cpu_cgroup()
    # Only CPU time is counted, so neither the saboteurs nor a loaded machine (it passes
    # with two busy loops beside it) change the honest run's reward. The saboteurs' own
    # reward depends on how fast their tests run against their spinners: not asserted.
    reward = functools.partial(code_reward, test_timeout_s=1.0, total_timeout_s=3.0)
    alone = reward(HONEST, TESTS)
    with ThreadPoolExecutor(3) as pool:
        beside = list(pool.map(reward, [SABOTEUR, HONEST, SABOTEUR], [TESTS] * 3))
    assert alone == 1.0
    assert beside[1] == 1.0, "an honest run lost to its neighbours"


def test_run_cpu_time_counts_every_process_and_is_capped() -> None:
    needs_cpu_cgroup()
    spinners = "import os\nfor _ in range(5):\n    if os.fork() == 0:\n        os.setsid()\n        break\nwhile True:\n    pass\n"
    result = run_python(spinners, config=SandboxConfig(timeout_s=1.0, wall_timeout_s=60))
    assert result.timed_out and not result.ok
    # Six spinning processes, yet the run is stopped once all of them used 1 s together.
    assert result.cpu_s is not None and 1.0 <= result.cpu_s < 1.5, result.cpu_s


# --------------------------------------------------------------------------------------------
# Limits under load: HumanEval/75 (is_multiply_prime), 8 at once beside 8 busy loops
# --------------------------------------------------------------------------------------------

HUMANEVAL_75 = """```python
def is_multiply_prime(a):
    def is_prime(n):
        for j in range(2,n):
            if n%j == 0:
                return False
        return True

    for i in range(2,101):
        if not is_prime(i): continue
        for j in range(2,101):
            if not is_prime(j): continue
            for k in range(2,101):
                if not is_prime(k): continue
                if i*j*k == a: return True
    return False
```"""
HUMANEVAL_75_TEST = """
def check(candidate):
    assert candidate(5) == False
    assert candidate(30) == True
    assert candidate(8) == True
    assert candidate(10) == False
    assert candidate(125) == True
    assert candidate(3 * 5 * 7) == True
    assert candidate(3 * 6 * 7) == False
    assert candidate(9 * 9 * 9) == False
    assert candidate(11 * 9 * 9) == False
    assert candidate(11*13*7) == True
check(is_multiply_prime)
"""


@pytest.mark.slow
def test_correct_solutions_pass_on_a_busy_machine() -> None:
    """HumanEval/75's reference solution, 8 at once beside 8 busy loops (load >= 8), and 8
    correct solutions that need about 0.4 s of CPU per test against a 1 s limit: on a busy
    machine each gets a fraction of a core, so a wall-clock limit would fail them; a CPU-time
    limit does not."""
    needs_cpu_cgroup()
    heavy = functools.partial(code_reward, test_timeout_s=1.0)
    busy = [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"]) for _ in range(8)]
    try:
        humaneval, errors = score(
            code_reward, [HUMANEVAL_75] * 8, [ex(tests=[HUMANEVAL_75_TEST])] * 8, workers=8
        )
        heavy_rewards, heavy_errors = score(heavy, [HONEST] * 8, [TESTS] * 8, workers=8)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    assert humaneval == [1.0] * 8 and errors == 0
    assert heavy_rewards == [1.0] * 8 and heavy_errors == 0
