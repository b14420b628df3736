"""The code-execution sandbox: running programs and containing hostile ones.

Hostile programs (infinite loop, fork bomb, memory bomb; reading, writing and networking
outside the sandbox and killing the parent are in test_sandbox_escape) must each be
contained, score 0, and leave this process — standing in for the trainer — running. Assertions follow the mechanisms the
machine actually provides (:func:`gspo.sandbox.isolation`); on a root Linux host with
namespaces that is all of them, and ``test_isolation_on_this_machine`` says which are active.
The code reward and bounded-time rewards are in test_sandbox_rewards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sandbox_support
from sandbox_support import (
    FULL_ISOLATION,
    SLACK_S,
    SYSTEM_PYTHON,
    ex,
    history_mark,
    leftovers,
    needs,
    needs_root,
    needs_system_python,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.sandbox import (
    SandboxConfig,
    SandboxError,
    TestSuite,
    code_reward,
    run_python,
    run_tests,
)

# The module-scoped fixture, shared with the other sandbox files.
iso = sandbox_support.iso

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# 1 s of CPU time; a wall-clock backstop of 2 s (the default, 10x + 5 s, is for busy machines).
FAST = SandboxConfig(timeout_s=1.0, wall_timeout_s=2.0, memory_mb=256)


def test_isolation_on_this_machine(iso) -> None:
    print("active:", sorted(iso.mechanisms), "missing:", iso.missing)
    # Either a real network namespace or the documented weak fallback.
    assert "netns" in iso.mechanisms or "audit_hook" in iso.mechanisms
    needs_root()
    assert iso.mechanisms >= FULL_ISOLATION  # (the fixture made sure; stated here for the log)


# --------------------------------------------------------------------------------------------
# Ordinary programs
# --------------------------------------------------------------------------------------------


def test_run_python_stdin_files_args_exit_status() -> None:
    code = (
        "import sys\n"
        "data = sys.stdin.read()\n"
        "print(data.upper(), open('data.txt').read(), sys.argv[1:])\n"
        "sys.exit(3)\n"
    )
    result = run_python(code, stdin="hello", files={"data.txt": "file"}, args=["a", "b"])
    assert result.returncode == 3 and not result.ok
    assert result.stdout == "HELLO file ['a', 'b']\n"
    ok = run_python("print('fine')")
    assert ok.ok and ok.stdout == "fine\n" and not ok.timed_out


def test_run_python_reports_crashes_on_stderr() -> None:
    result = run_python("raise ValueError('boom')")
    assert result.returncode == 1 and "ValueError: boom" in result.stderr


def test_run_python_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="plain names"):
        run_python("pass", files={"../x": "y"})
    with pytest.raises(ValueError, match=r"main\.py"):
        run_python("pass", files={"main.py": "y"})
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", config=SandboxConfig(timeout_s=0))
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=10).validate()


def test_output_cap_kills_a_flood_quickly() -> None:
    start = time.monotonic()
    result = run_python("while True: print('x' * 1000)", config=SandboxConfig(timeout_s=20))
    assert result.output_limit and not result.ok
    assert len(result.stdout) <= SandboxConfig().max_output_bytes
    assert time.monotonic() - start < 10


def test_files_and_disk_are_bounded() -> None:
    big = run_python("open('f', 'wb').write(b'x' * (40 << 20))", config=FAST)
    assert big.returncode == 1 and "File too large" in big.stderr
    fill = run_python(
        "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (8 << 20)); i += 1",
        config=FAST,
    )
    assert fill.returncode == 1 and ("No space left" in fill.stderr or "too large" in fill.stderr)


# --------------------------------------------------------------------------------------------
# Hostile programs: contained, scored 0, the caller survives
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_infinite_loop_is_stopped_within_the_limit() -> None:
    for code in ("while True: pass", "import time\ntime.sleep(1000)"):
        start = time.monotonic()
        result = run_python(code, config=FAST)
        elapsed = time.monotonic() - start
        assert result.timed_out and result.returncode is None and not result.ok
        assert FAST.timeout_s <= elapsed < FAST.wall_timeout_s + SLACK_S
    suite = {"tests": ["assert f(1) == 1", "assert f(2) == 2"]}
    start = time.monotonic()
    assert code_reward("def f(x):\n    while True: pass", ex(**suite), test_timeout_s=0.5) == 0.0
    assert time.monotonic() - start < 2 * 0.5 + 2.0 + SLACK_S


def test_alarm_blocking_loop_is_still_bounded_by_the_total_limit() -> None:
    # The solution switches off timers of its own process: the per-test limit is the run's
    # cgroup CPU counter, read by the judge, so the test fails there, not at the run's limit.
    code = (
        "import signal\ndef f(x):\n"
        "    for s in (signal.SIGALRM, signal.SIGPROF):\n        signal.signal(s, signal.SIG_IGN)\n"
        "    while True: pass"
    )
    start = time.monotonic()
    report = run_tests(
        code,
        TestSuite.from_meta({"tests": ["assert f(1)"]}),
        test_timeout_s=0.3,
        total_timeout_s=1.0,
    )
    assert report.passed == (False,) and "CPU time limit" in (report.errors[0] or "")
    assert not report.run.timed_out
    assert time.monotonic() - start < 1.0 + SLACK_S


FORK_BOMB = """
import os, time
count = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.01)
        continue
    if pid == 0:
        try:
            os.setsid()  # try to leave the process group that gets killed on timeout
        except OSError:
            pass
    count += 1
"""


@pytest.mark.slow
def test_fork_bomb_is_contained(iso) -> None:
    mark = history_mark()
    result = run_python(FORK_BOMB, config=FAST)
    assert result.timed_out and not result.ok
    # Every descendant is gone and the caller can still start processes.
    assert leftovers(mark) == []
    assert subprocess.run(["true"], check=False).returncode == 0
    if iso.processes_bounded:
        # The process count was capped while it ran: count them from inside.
        probe = run_python(
            "import os\nn = 0\nfor _ in range(100):\n"
            "    try:\n        if os.fork() == 0:\n            import time; time.sleep(5)\n"
            "        n += 1\n    except OSError:\n        break\nprint(n, flush=True)\nos._exit(0)",
            config=FAST,
        )
        assert int(probe.stdout) < FAST.max_processes
    # It uses little CPU (it sleeps between failed forks): its wall-clock backstop ends it.
    bomb = FORK_BOMB + "\ndef f(): return 1"
    assert code_reward(bomb, ex(tests=["assert f() == 1"]), config=FAST) == 0.0


def test_memory_bomb_is_contained() -> None:
    config = SandboxConfig(timeout_s=5.0, memory_mb=128)
    result = run_python("x = []\nwhile True:\n    x.append(bytearray(1 << 24))", config=config)
    assert result.returncode == 1 and "MemoryError" in result.stderr and not result.timed_out
    one_shot = run_python("x = bytearray(1 << 30)", config=config)
    assert one_shot.returncode == 1 and "MemoryError" in one_shot.stderr
    bomb = "x = bytearray(1 << 30)\ndef f(): return 1"
    assert code_reward(bomb, ex(tests=["assert f() == 1"]), config=config) == 0.0


def test_exit_hacks_do_not_pass_tests() -> None:
    suite = ex(tests=["assert f(1) == 2", "assert f(2) == 4"])
    for hack in (
        "import os\nos._exit(0)",
        "import sys\nsys.exit(0)",
        "exit()",
        "import os, json\nos.write(int(os.environ.get('GSPO_RESULT_FD', 1)), b'{\"i\": 0, \"ok\": true}\\n')",
    ):
        assert code_reward(hack, suite) == 0.0, hack


def test_concurrent_runs_do_not_interfere() -> None:
    program = "import os, time\nopen('mine', 'w').write('{n}')\ntime.sleep(0.3)\nprint(open('mine').read(), os.getuid())"

    def run(n: int):
        if n == 0:
            return run_python(FORK_BOMB, config=FAST)
        return run_python(program.format(n=n), config=SandboxConfig(timeout_s=10))

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, range(4)))
    assert results[0].timed_out
    uids = set()
    for n, result in enumerate(results[1:], start=1):
        assert result.ok, result.stderr
        value, uid = result.stdout.split()
        assert value == str(n)
        uids.add(uid)
    if os.geteuid() == 0:
        assert len(uids) == 3  # each concurrent run had its own uid


def test_require_isolation(iso) -> None:
    complete = {"netns", "mountns", "pidns"} <= iso.mechanisms
    if complete:
        assert run_python("print(1)", config=SandboxConfig(require_isolation=True)).ok
    else:
        with pytest.raises(SandboxError):
            run_python("print(1)", config=SandboxConfig(require_isolation=True))


def test_site_packages_hidden_unless_asked(iso) -> None:
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    listing = run_python(
        f"import os\nprint(os.listdir({site!r}) if os.path.isdir({site!r}) else [])"
    )
    if iso.files_hidden:
        assert listing.stdout.strip() == "[]"
    pytest.importorskip("numpy")
    result = run_python(
        "import numpy\nprint(int(numpy.arange(4).sum()))", config=SandboxConfig(site_packages=True)
    )
    assert result.stdout.strip() == "6", result.stderr
    assert not run_python("import numpy").ok  # the default: standard library only


def test_another_interpreter(iso) -> None:
    python = SYSTEM_PYTHON
    needs_system_python()
    needs(iso.files_hidden, f"needs a mount namespace (missing: {iso.missing})")
    result = run_python("import sys\nprint(sys.executable)", config=SandboxConfig(python=python))
    assert result.ok and result.stdout.strip() == python


def test_fallback_without_namespaces_blocks_sockets_with_the_audit_hook() -> None:
    python = SYSTEM_PYTHON
    needs_system_python()  # the caller's may be unreachable for the sandbox uid (/root)
    config = SandboxConfig(timeout_s=5, namespaces=False, python=python)
    try:
        result = run_python(
            "import socket\ntry:\n    socket.socket()\n    print('socket')\n"
            "except PermissionError as e:\n    print('blocked', e)\n",
            config=config,
        )
    except SandboxError as exc:  # e.g. the interpreter is unreachable for the sandbox uid
        needs(False, f"the fallback cannot run here: {exc}")
    assert (
        "audit_hook" in result.isolation.mechanisms and "netns" not in result.isolation.mechanisms
    )
    assert "blocked sandbox: socket" in result.stdout


UNPRIVILEGED_CALLER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from gspo.sandbox import SandboxConfig, run_python
result = run_python(
    "import json, os, socket\\n"
    "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\\n"
    "try:\\n    socket.create_connection(('1.1.1.1', 53), timeout=1); net = 'open'\\n"
    "except OSError:\\n    net = 'blocked'\\n"
    "print(json.dumps({'uid': os.getuid(), 'caps': caps[0], 'net': net, 'root': sorted(os.listdir('/'))}))",
    config=SandboxConfig(timeout_s=5),
)
print(json.dumps({"mechanisms": sorted(result.isolation.mechanisms), "stdout": result.stdout,
                  "stderr": result.stderr[-500:]}))
"""


def test_unprivileged_caller_gets_user_namespaces() -> None:
    """A non-root trainer: a user namespace stands in for the dedicated uid."""
    python = SYSTEM_PYTHON
    src = str(Path(__file__).resolve().parents[1] / "src")
    needs_root()  # to become nobody
    needs_system_python()
    proc = subprocess.run(
        [python, "-I", "-c", UNPRIVILEGED_CALLER, src],
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        env={},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    needs(proc.returncode == 0, f"cannot run as nobody here: {proc.stderr[-300:]}")
    report = json.loads(proc.stdout)
    needs("userns" in report["mechanisms"], f"needs unprivileged user namespaces: {report}")
    assert {"mountns", "netns", "pidns", "nproc"} <= set(report["mechanisms"])
    inside = json.loads(report["stdout"])
    assert inside["uid"] == 65534 and int(inside["caps"], 16) == 0  # no capabilities left
    assert inside["net"] == "blocked" and "root" not in inside["root"]
