"""The sandbox against the attacks of its hardening round, one class per section.

Kernel keyrings; uid slots shared by trainers with different TMPDIR; malformed result
records; near-miss large integers; the base interpreter's site-packages. (The seccomp deny
list and nested namespaces are in test_sandbox_seccomp; memory and task bounds in
test_sandbox_memory.) Each section asserts the isolation asked for, observed
from inside the sandbox, not what the sandbox reports it applied. Tests that need root, a
cgroup or a particular interpreter skip with a reason (and fail in CI, see sandbox_support).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from decimal import Decimal
from pathlib import Path

import pytest
from sandbox_support import (
    MACHINE,
    SYSCALL,
    ex,
    inside,
    needs,
    needs_full_isolation,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.sandbox import (
    SandboxConfig,
    TestSuite,
    code_reward,
    isolation,
    run_python,
    run_tests,
)
from gspo.sandbox import seccomp as sandbox_seccomp
from gspo.sandbox.cgroup import detect as detect_cgroup
from gspo.sandbox.compare import parse_results, values_match

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
SRC = str(Path(__file__).resolve().parents[1] / "src")
# A uid range of this test process's own for tests that pin a slot (other suites may run at
# the same time; the default range stays theirs).
PRIVATE_BASE_UID = 63000 + (os.getpid() % 900) * 2


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
# Keyrings
# --------------------------------------------------------------------------------------------

KEYRING_CALLER = r"""
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
from gspo.sandbox import SandboxConfig, run_python
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
# uid slots
# --------------------------------------------------------------------------------------------

SLOT_CALLER = r"""
import json, sys, tempfile
sys.path.insert(0, sys.argv[1])
from gspo.sandbox import SandboxConfig, run_python
print("tmp", tempfile.gettempdir(), file=sys.stderr, flush=True)
config = SandboxConfig(timeout_s=30, base_uid=int(sys.argv[2]), uid_slots=1)
r = run_python(sys.argv[3], config=config)
print(json.dumps({"ok": r.ok, "stdout": r.stdout, "returncode": r.returncode, "stderr": r.stderr[-300:]}))
"""


@pytest.mark.slow
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
    """A program that floods every descriptor it has with records that break parsers: the
    result channel is not among them (the judge holds it), so only its own worker pipes
    carry them, and the judge gives up on a message over its size limit."""
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
    assert "loading the solution failed" in (report.errors[0] or "")
    assert code_reward(hostile, ex(tests=["assert True"])) == 0.0
    deep = "def f():\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x"
    meta = {
        "test_cases": [{"input": "", "output": "[]", "testtype": "functional"}],
        "func_name": "f",
    }
    assert code_reward(deep, ex(**meta)) == 0.0


@pytest.mark.slow
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
from gspo.sandbox import SandboxConfig, run_python
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
