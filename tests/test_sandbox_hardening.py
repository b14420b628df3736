"""The sandbox against the attacks of its hardening round, one class per section.

Kernel keyrings; memory outside the per-process limits (memfd, shared memory, tmpfs, many
processes); nested user namespaces and the rest of the seccomp deny list; uid slots shared
by trainers with different TMPDIR; malformed result records; near-miss large integers; the
base interpreter's site-packages. Each section asserts the isolation asked for, observed
from inside the sandbox, not what the sandbox reports it applied. Tests that need root, a
cgroup or a particular interpreter skip with a reason (and fail in CI, see sandbox_checks).
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from decimal import Decimal
from pathlib import Path

import pytest
from sandbox_checks import history_mark, leftovers, needs, needs_root

from gspo.envs.sandbox import (
    SandboxConfig,
    TestSuite,
    code_reward,
    isolation,
    run_python,
    run_tests,
)
from gspo.envs.sandbox import seccomp as sandbox_seccomp
from gspo.envs.sandbox.cgroup import detect as detect_cgroup
from gspo.envs.sandbox.compare import parse_results, values_match
from gspo.envs.tasks.base import Example

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

MACHINE = os.uname().machine
SRC = str(Path(__file__).resolve().parents[1] / "src")
# A uid range of this test process's own for tests that pin a slot (other suites may run at
# the same time; the default range stays theirs).
PRIVATE_BASE_UID = 63000 + (os.getpid() % 900) * 2


def ex(**meta: object) -> Example:
    return Example(prompt="", answer="", meta=dict(meta))


@pytest.fixture(autouse=True)
def no_leftovers():
    mark = history_mark()
    yield
    assert leftovers(mark) == [], "a sandboxed process outlived its run"


def needs_seccomp() -> None:
    needs(
        MACHINE in sandbox_seccomp.AUDIT_ARCH,
        f"the seccomp filter is for x86_64/aarch64, not {MACHINE}",
    )


def needs_full_isolation() -> None:
    needs_root()
    missing = {"mountns", "netns", "pidns", "uid", "seccomp", "keyring"} - isolation().mechanisms
    needs(not missing, f"needs {sorted(missing)} (missing: {isolation().missing})")


def needs_cgroup() -> None:
    needs_root()
    backend, why = detect_cgroup()
    needs(backend is not None, f"needs a writable cgroup (v2 delegated or v1 memory+pids): {why}")


def inside(code: str, **config: object) -> dict:
    """Run ``code`` (which prints one JSON object last) in the sandbox; return that object."""
    result = run_python(textwrap.dedent(code), config=SandboxConfig(timeout_s=20, **config))
    assert result.ok, (result.returncode, result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


# A ctypes syscall(2) for programs in the sandbox.
SYSCALL = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
"""


# --------------------------------------------------------------------------------------------
# The isolation asked for, observed from inside
# --------------------------------------------------------------------------------------------


def test_isolation_is_what_was_asked() -> None:
    """Namespaces, uid, capabilities, seccomp, filesystem, network, limits: seen by the program."""
    needs_full_isolation()
    ours = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("net", "mnt", "pid", "ipc", "uts")}
    config = SandboxConfig(timeout_s=20, require_isolation=True)
    code = """
    import json, os, resource, socket, errno
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    try:
        socket.create_connection(("127.0.0.1", 22), timeout=1)
        net = "connected"
    except OSError as e:
        net = errno.errorcode.get(e.errno, str(e.errno))
    print(json.dumps({
        "ns": {n: os.readlink(f"/proc/self/ns/{n}") for n in ("net", "mnt", "pid", "ipc", "uts")},
        "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(),
        "caps": int(status["CapEff"], 16), "nnp": status["NoNewPrivs"].strip(),
        "seccomp": status["Seccomp"].strip(), "ppid": os.getppid(), "pid": os.getpid(),
        "root": sorted(os.listdir("/")), "net": net, "host": socket.gethostname(),
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
        "as": resource.getrlimit(resource.RLIMIT_AS)[0],
        "cgroup": open("/proc/self/cgroup").read(),
    }))
    """
    result = run_python(textwrap.dedent(code), config=config)
    assert result.ok, result.stderr
    seen = json.loads(result.stdout)
    assert all(seen["ns"][ns] != ours[ns] for ns in ours), (seen["ns"], ours)
    assert config.base_uid <= seen["uid"] < config.base_uid + config.uid_slots
    assert seen["euid"] == seen["uid"] and seen["groups"] == []
    assert seen["caps"] == 0 and seen["nnp"] == "1" and seen["seccomp"] == "2"
    assert seen["ppid"] == 1 and seen["pid"] < 10  # own pid namespace, init is its parent
    assert set(seen["root"]) <= {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib64",
        "lib32",
        "libx32",
        "etc",
        "dev",
        "tmp",
        "proc",
        "work",
        "root",
    }
    # AF_INET is not an allowed socket family (the network namespace is empty anyway).
    assert seen["net"] == "EAFNOSUPPORT" and seen["host"] == "sandbox"
    assert seen["nproc"] == config.max_processes and seen["as"] == config.memory_mb << 20
    if detect_cgroup()[0] is not None:
        assert "gspo-sandbox-" in seen["cgroup"]


# --------------------------------------------------------------------------------------------
# seccomp
# --------------------------------------------------------------------------------------------


def test_seccomp_filter_program_decides_every_call() -> None:
    """The BPF program, interpreted: denied calls EPERM, clone3 ENOSYS, clone with namespace
    flags EPERM, other calls allowed, a foreign ABI killed; on both architectures."""
    for machine, arch in sandbox_seccomp.AUDIT_ARCH.items():
        program = sandbox_seccomp.build_filter(machine)
        assert program is not None and len(program) < 200
        run = sandbox_seccomp.run_filter
        denied = sandbox_seccomp.denied_syscalls(machine)
        for name in (
            "keyctl",
            "add_key",
            "request_key",
            "unshare",
            "mount",
            "memfd_create",
            "bpf",
            "ptrace",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "perf_event_open",
            "setns",
            "shmget",
            "userfaultfd",
        ):
            assert run(program, denied[name], arch) == 0x00050000 | errno.EPERM, (machine, name)
        assert run(program, sandbox_seccomp.CLONE3, arch) == 0x00050000 | errno.ENOSYS
        clone = sandbox_seccomp.CLONE[machine]
        assert run(program, clone, arch, 0x10000000 | 17) == 0x00050000 | errno.EPERM  # NEWUSER
        assert run(program, clone, arch, 0x40000000) == 0x00050000 | errno.EPERM  # NEWNET
        assert run(program, clone, arch, 0x003D0F00) == 0x7FFF0000  # pthread_create's flags
        allowed = {0, 1, 2, 3, 9, 59, 60, 231} - set(denied.values())  # read, write, ...
        assert all(run(program, nr, arch) == 0x7FFF0000 for nr in allowed)
        assert run(program, 0, 0x40000003) == 0x80000000  # i386: kill
    x86 = sandbox_seccomp.build_filter("x86_64")
    assert sandbox_seccomp.run_filter(x86, 0x40000000 | 1, 0xC000003E) == 0x80000000  # x32
    assert sandbox_seccomp.build_filter("riscv64") is None


def test_seccomp_numbers_match_the_kernel_headers() -> None:
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    needs(header.exists(), f"needs the x86_64 kernel headers ({header})")
    table = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+) (\d+)", header.read_text())}
    for name, number in sandbox_seccomp.denied_syscalls("x86_64").items():
        assert table[name] == number, name
    assert table["clone"] == sandbox_seccomp.CLONE["x86_64"] and table["clone3"] == 435


def test_each_denied_call_fails_inside() -> None:
    needs_seccomp()
    needs_full_isolation()
    denied = sandbox_seccomp.denied_syscalls(MACHINE)
    clone = sandbox_seccomp.CLONE[MACHINE]
    code = (
        SYSCALL
        + f"""
denied = {denied!r}
out = {{name: call(nr, 0, 0, 0, 0, 0)[1] for name, nr in denied.items()}}
for name, flag in (("clone_newuser", 0x10000000), ("clone_newns", 0x20000), ("clone_newnet", 0x40000000)):
    r, e = call({clone}, flag | 17, 0, 0, 0, 0)
    if r == 0:
        os._exit(0)  # (the child, were it allowed)
    out[name] = e
out["clone3"] = call(435, 0, 0)[1]
print(json.dumps(out))
"""
    )
    seen = inside(code)
    wrong = {
        k: errno.errorcode.get(v, v) for k, v in seen.items() if v != errno.EPERM and k != "clone3"
    }
    assert wrong == {}, wrong
    assert seen["clone3"] == errno.ENOSYS


def test_normal_programs_still_run() -> None:
    needs_seccomp()
    code = """
    import json, os, subprocess, sys, threading, multiprocessing, tempfile, time, select
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("thread", True)); t.start(); t.join()
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    out["fork"] = os.WEXITSTATUS(os.waitpid(pid, 0)[1])
    out["subprocess"] = subprocess.run([sys.executable, "-S", "-c", "print(6*7)"],
                                       capture_output=True, text=True).stdout.strip()
    out["echo"] = subprocess.run(["/bin/echo", "hi"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 100000); f.seek(0); out["file"] = len(f.read())
    r, w = os.pipe(); os.write(w, b"p"); out["pipe"] = os.read(r, 1).decode()
    out["seccomp"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0]
    out["sum"] = sum(range(10**6))
    print(json.dumps(out))
    """
    seen = inside(code)
    assert seen == {
        "thread": True,
        "fork": 7,
        "subprocess": "42",
        "echo": "hi",
        "file": 100000,
        "pipe": "p",
        "seccomp": "2",
        "sum": 499999500000,
    }
    assert (
        code_reward("```python\ndef f(x):\n    return 2 * x\n```", ex(tests=["assert f(2) == 4"]))
        == 1.0
    )


# --------------------------------------------------------------------------------------------
# Keyrings
# --------------------------------------------------------------------------------------------

KEYRING_CALLER = r"""
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
from gspo.envs.sandbox import SandboxConfig, run_python
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
# Our own session keyring, holding a secret.
assert libc.syscall(ctypes.c_long(nr[1]), ctypes.c_long(1), ctypes.c_long(0)) > 0
secret = b"caller-secret-value"
key = libc.syscall(ctypes.c_long(nr[0]), b"user", b"gspo-test-secret", secret,
                   ctypes.c_size_t(len(secret)), ctypes.c_long(-3))
assert key > 0, ctypes.get_errno()
program = sys.argv[2]
config = SandboxConfig(timeout_s=20, seccomp=False, base_uid=int(sys.argv[3]), uid_slots=1)
runs = [run_python(program, args=[str(key), mode], config=config) for mode in ("plant", "look")]
print(json.dumps([r.stdout for r in runs] + [runs[1].stderr[-500:]]))
"""

KEYRING_PROGRAM = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
caller_key, mode = int(sys.argv[1]), sys.argv[2]
buf = ctypes.create_string_buffer(256)
out = {}
# KEYCTL_READ (11) of the caller's key by its serial; KEYCTL_SEARCH (10) of our session keyring.
n = libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(11), ctypes.c_long(caller_key), buf, ctypes.c_long(256))
out["read_caller_key"] = buf.raw[:n].decode() if n > 0 else ctypes.get_errno()
n = libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(10), ctypes.c_long(-3), b"user", b"gspo-test-secret", ctypes.c_long(0))
out["search_session"] = n if n > 0 else ctypes.get_errno()
if mode == "plant":
    out["plant"] = libc.syscall(ctypes.c_long(add_key), b"user", b"planted", b"state", ctypes.c_size_t(5), ctypes.c_long(-4))
else:
    n = libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(10), ctypes.c_long(-4), b"user", b"planted", ctypes.c_long(0))
    out["found_planted"] = n if n > 0 else ctypes.get_errno()
print(json.dumps(out))
"""


def test_keyrings_are_fresh_and_cleared() -> None:
    """Without seccomp (its own layer, tested next), a run sees neither the caller's session
    keyring nor keys an earlier run of the same uid left in the user keyring."""
    needs_full_isolation()
    needs(
        MACHINE in ("x86_64", "aarch64"), f"keyctl numbers known for x86_64/aarch64, not {MACHINE}"
    )
    proc = subprocess.run(
        [sys.executable, "-c", KEYRING_CALLER, SRC, KEYRING_PROGRAM, str(PRIVATE_BASE_UID)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    plant, look, stderr = json.loads(proc.stdout)
    plant, look = json.loads(plant), json.loads(look)
    assert plant["read_caller_key"] != "caller-secret-value"  # EACCES / ENOKEY
    assert plant["search_session"] == errno.ENOKEY  # a fresh session keyring: empty
    assert plant["plant"] > 0  # (the program could write its user keyring...)
    assert look["found_planted"] == errno.ENOKEY, stderr  # (...but the next run finds nothing)
    # With the filter on, the calls fail outright.
    blocked = inside(
        SYSCALL
        + f"""
print(json.dumps([call(n, 0, 0, 0, 0, 0)[1] for n in {[sandbox_seccomp.denied_syscalls(MACHINE)[k] for k in ("add_key", "keyctl", "request_key")]}]))
"""
    )
    assert blocked == [errno.EPERM] * 3


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


def test_run_cgroup_bounds_tasks_by_itself() -> None:
    """pids.max of a run's cgroup, alone (in a run RLIMIT_NPROC applies as well): a root
    process in a cgroup with pids.max 4 starts 3 children, then fork fails."""
    needs_cgroup()
    from gspo.envs.sandbox.cgroup import RunCgroup

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


# --------------------------------------------------------------------------------------------
# Nested user namespaces and netfilter
# --------------------------------------------------------------------------------------------


def test_no_nested_namespaces_or_capabilities() -> None:
    needs_seccomp()
    needs_full_isolation()
    code = (
        SYSCALL
        + """
import socket
out = {}
for name, flags in (("user", 0x10000000), ("net", 0x40000000), ("user+net", 0x50000000)):
    out[name] = errno.errorcode.get(libc.unshare(flags) and ctypes.get_errno(), "made")
out["setns"] = errno.errorcode[call(308 if os.uname().machine == "x86_64" else 268, 0, 0)[1]]
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm", "CapBnd", "CapAmb"))]
out["caps"] = [int(c, 16) for c in caps]
# Netfilter needs CAP_NET_ADMIN in the namespace owning the netns: a rule change is refused.
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
    s.bind((0, 0))
    import struct
    # nfnetlink NFNL_SUBSYS_NFTABLES (10) NFT_MSG_NEWTABLE (0), with NLM_F_REQUEST|ACK|CREATE.
    msg = struct.pack("=IHHII", 20, (10 << 8) | 0, 0x1 | 0x4 | 0x400, 1, 0) + struct.pack("=BBH", 2, 0, 0)
    s.sendto(msg, (0, 0))
    reply = s.recv(4096)
    out["netfilter"] = -struct.unpack("=i", reply[16:20])[0]
except OSError as e:
    out["netfilter"] = e.errno
print(json.dumps(out))
"""
    )
    seen = inside(code)
    assert seen["user"] == seen["net"] == seen["user+net"] == "EPERM"
    assert seen["setns"] == "EPERM"
    assert seen["caps"][:2] == [0, 0]  # no effective or permitted capability
    assert seen["netfilter"] in (
        errno.EPERM,
        errno.EACCES,
        errno.EAFNOSUPPORT,
        errno.EPROTONOSUPPORT,
    )


# --------------------------------------------------------------------------------------------
# uid slots
# --------------------------------------------------------------------------------------------

SLOT_CALLER = r"""
import json, sys, tempfile
sys.path.insert(0, sys.argv[1])
from gspo.envs.sandbox import SandboxConfig, run_python
print("tmp", tempfile.gettempdir(), file=sys.stderr, flush=True)
config = SandboxConfig(timeout_s=30, base_uid=int(sys.argv[2]), uid_slots=1)
r = run_python(sys.argv[3], config=config)
print(json.dumps({"ok": r.ok, "stdout": r.stdout, "returncode": r.returncode, "stderr": r.stderr[-300:]}))
"""


def test_uid_slot_is_not_shared_by_callers_with_different_tmpdir(tmp_path: Path) -> None:
    """Two trainers with different TMPDIR and one slot: the second waits; nobody is killed."""
    needs_full_isolation()
    long_run = "import os, time\ntime.sleep(3)\nprint('survived', os.getuid())"
    short_run = "import os\nprint('second', os.getuid())"
    procs = []
    for i, program in enumerate((long_run, short_run)):
        tmp = tmp_path / f"tmp{i}"
        tmp.mkdir()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SLOT_CALLER, SRC, str(PRIVATE_BASE_UID), program],
                env={**os.environ, "TMPDIR": str(tmp)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        time.sleep(1.5)  # the first is running its program when the second asks for a uid
    outs = [p.communicate(timeout=120) for p in procs]
    first, second = (json.loads(out) for out, _ in outs)
    assert first["ok"] and first["stdout"].split() == ["survived", str(PRIVATE_BASE_UID)], first
    assert second["ok"] and second["stdout"].split() == ["second", str(PRIVATE_BASE_UID)], second
    assert f"tmp {tmp_path / 'tmp0'}" in outs[0][1] and f"tmp {tmp_path / 'tmp1'}" in outs[1][1]


def test_uid_with_live_processes_is_skipped_not_killed() -> None:
    needs_full_isolation()
    squatter = subprocess.Popen(
        ["sleep", "60"], user=PRIVATE_BASE_UID, group=PRIVATE_BASE_UID, extra_groups=[]
    )
    try:
        config = SandboxConfig(timeout_s=10, base_uid=PRIVATE_BASE_UID, uid_slots=2)
        result = run_python("import os\nprint(os.getuid())", config=config)
        assert result.ok and int(result.stdout) == PRIVATE_BASE_UID + 1
        assert squatter.poll() is None, "a run killed a process it did not start"
    finally:
        squatter.kill()
        squatter.wait()


# --------------------------------------------------------------------------------------------
# Result records and comparison
# --------------------------------------------------------------------------------------------


def test_parser_never_raises_and_names_the_problem() -> None:
    nonce = "n0"
    lines = [
        b"[" * 100_000,  # nesting deeper than the JSON parser's recursion
        b'{"nonce": "n0", "i": 0, "ok": true, "value": ' + b"9" * 100_000 + b"}",  # long int
        b"{not json",
        b'{"nonce": "n0", "i": "0", "ok": true}',  # wrong shape
        b'{"nonce": "n0", "i": 1, "ok": "yes"}',
        b'{"nonce": "other", "i": 1, "ok": true}',  # not ours: ignored silently
        b'{"nonce": "n0", "i": 1, "ok": false, "error": "boom"}',
        "\udcff".encode("utf-8", "surrogatepass"),
    ]
    records, problems = parse_results(b"\n".join(lines), nonce, 2)
    assert set(records) == {0, 1} and records[0]["value"] == Decimal("9" * 100_000)
    assert records[1]["error"] == "boom"
    assert len(problems) == 3 and "RecursionError" in problems[0]


def test_malformed_records_score_zero_with_a_reason() -> None:
    """A program that floods the result channel with records that break parsers."""
    hostile = (
        "import os\n"
        "for fd in range(3, 20):\n"
        "    try:\n"
        "        os.write(fd, b'[' * 200000 + b'\\n' + b'{\"i\": 0, \"ok\": true, \"value\": ' + b'9' * 10000 + b'}\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    report = run_tests(hostile, TestSuite.from_meta({"tests": ["assert True"]}))
    assert report.passed == (False,)
    assert "malformed result records" in report.errors[0] and "RecursionError" in report.errors[0]
    assert code_reward(hostile, ex(tests=["assert True"])) == 0.0
    deep = "def f():\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x"
    meta = {
        "test_cases": [{"input": "", "output": "[]", "testtype": "functional"}],
        "func_name": "f",
    }
    assert code_reward(deep, ex(**meta)) == 0.0


def test_near_miss_large_integers_fail_and_exact_ones_pass() -> None:
    big = 10**12
    functional = {
        "test_cases": [{"input": "", "output": str(big), "testtype": "functional"}],
        "func_name": "f",
    }
    assert code_reward("def f():\n    return 1000000999999", ex(**functional)) == 0.0
    assert code_reward("def f():\n    return 10**12", ex(**functional)) == 1.0
    assert code_reward("def f():\n    return 1e12", ex(**functional)) == 1.0  # equal in value
    stdio = {"inputs": [""], "outputs": [f"{big}\n"]}
    assert code_reward("print(1000000999999)", ex(**stdio)) == 0.0
    assert code_reward("print(10**12)", ex(**stdio)) == 1.0
    huge = "1" + "7" * 5000  # over Python's 4300-digit int/str limit, on both sides
    huge_case = {
        "test_cases": [{"input": "", "output": huge, "testtype": "functional"}],
        "func_name": "f",
    }
    assert code_reward("def f():\n    return int('1' + '7' * 5000)", ex(**huge_case)) == 1.0
    assert code_reward("def f():\n    return int('1' + '7' * 5000) + 1", ex(**huge_case)) == 0.0
    assert code_reward(f"print('{huge}')", ex(inputs=[""], outputs=[huge])) == 1.0
    assert code_reward(f"print('{huge[:-1]}8')", ex(inputs=[""], outputs=[huge])) == 0.0
    floats = {
        "test_cases": [{"input": "", "output": "0.3", "testtype": "functional"}],
        "func_name": "f",
    }
    assert code_reward("def f():\n    return 0.1 + 0.2", ex(**floats)) == 1.0  # within 1e-6
    assert code_reward("def f():\n    return 0.3001", ex(**floats)) == 0.0
    assert values_match("abc", "abc") and not values_match("abc ", "abc")
    assert not values_match(True, 1) and not values_match(1, True) and values_match(None, None)
    assert not values_match(10**400, 1.0)  # too large for a float: no match, no OverflowError


# --------------------------------------------------------------------------------------------
# Base interpreter's site-packages
# --------------------------------------------------------------------------------------------

VENV_CALLER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from gspo.envs.sandbox import SandboxConfig, run_python
program = '''
import json, os, sys
base = sys.argv[1]
listing = os.listdir(base) if os.path.isdir(base) else []
sys.path.append(base)
try:
    __import__(sys.argv[2]); imported = True
except ImportError:
    imported = False
print(json.dumps({"listing": listing, "imported": imported, "prefix": sys.prefix}))
'''
r = run_python(program, args=sys.argv[2:], config=SandboxConfig(timeout_s=20))
print(json.dumps({"stdout": r.stdout, "stderr": r.stderr[-500:], "mechanisms": sorted(r.isolation.mechanisms)}))
"""


def test_base_site_packages_hidden_when_running_from_a_venv(tmp_path: Path) -> None:
    """The trainer in a venv: the venv's and the base interpreter's site-packages are hidden."""
    import sysconfig

    needs(sys.prefix == sys.base_prefix, "runs from the base interpreter to make a venv of it")
    base_site = sysconfig.get_paths()["purelib"]
    packages = (
        sorted(p for p in os.listdir(base_site) if p.isidentifier())
        if os.path.isdir(base_site)
        else []
    )
    needs(bool(packages), f"needs a package in the base site-packages {base_site}")
    isolation_now = isolation()
    needs(
        "mountns" in isolation_now.mechanisms, f"needs a mount namespace: {isolation_now.missing}"
    )
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", VENV_CALLER, SRC, base_site, packages[0]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    seen = json.loads(report["stdout"])
    assert seen["listing"] == [] and not seen["imported"], (packages[0], report)


def test_cgroup_v2_files_on_a_stand_in_hierarchy(tmp_path: Path, monkeypatch) -> None:
    """The v2 backend's file protocol (this project's machines have controllers on v1 only,
    so the real v2 path cannot run here): detection through mountinfo and /proc/self/cgroup,
    enabling memory+pids for children, the limits written, and removal."""
    from gspo.envs.sandbox import cgroup as sandbox_cgroup

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
