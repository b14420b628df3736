"""The code-execution sandbox, the code reward, and bounded-time rewards.

Hostile programs (infinite loop, fork bomb, memory bomb, reading, writing and networking
outside the sandbox, killing the parent) must each be contained, score 0, and leave this
process — standing in for the trainer — running. Assertions follow the mechanisms the
machine actually provides (:func:`gspo.envs.sandbox.isolation`); on a root Linux host with
namespaces that is all of them, and ``test_isolation_on_this_machine`` says which are active.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sandbox_checks import (
    ROOT,
    SYSTEM_PYTHON,
    history_mark,
    leftovers,
    needs,
    needs_root,
    needs_system_python,
)

from gspo.envs.rewards import get_reward, score
from gspo.envs.sandbox import (
    RewardTimeout,
    RewardWorkerError,
    SandboxConfig,
    SandboxError,
    TestSuite,
    code_reward,
    extract_code,
    isolation,
    outputs_match,
    run_python,
    run_tests,
    with_timeout,
)
from gspo.envs.tasks.base import Example

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# 1 s of CPU time; a wall-clock backstop of 2 s (the default, 10x + 5 s, is for busy machines).
FAST = SandboxConfig(timeout_s=1.0, wall_timeout_s=2.0, memory_mb=256)
# Slack on top of a time limit: process start-up and teardown on a loaded 2-core machine.
SLACK_S = 3.0


def ex(**meta: object) -> Example:
    return Example(prompt="", answer="", meta=dict(meta))


# What a root caller on Linux must get (CI runs as root): with it, each test's conditional
# assertions below ("if iso.network_blocked") always run, so a missing mechanism fails them.
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


@pytest.fixture(autouse=True)
def no_leftovers():
    # Scoped to the runs this test started: other suites may run sandboxes meanwhile.
    mark = history_mark()
    yield
    assert leftovers(mark) == [], "a sandboxed process outlived its run"


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
    # The solution switches off the harness's per-test timers; the run's own limit remains.
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
    assert report.passed == (False,) and report.run.timed_out
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


def test_reading_files_outside_is_refused(iso, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-0600")
    secret.chmod(0o600)
    public = Path(f"/tmp/gspo-test-public-{os.getpid()}.txt")
    public.write_text("WORLD-READABLE-0644")
    public.chmod(0o644)
    readme = Path(__file__).resolve().parents[1] / "README.md"
    try:
        paths = [str(secret), str(public), str(readme), "/root/.bashrc", "/etc/shadow"]
        code = (
            f"for p in {paths!r}:\n"
            "    try:\n        print(open(p).read()[:40])\n"
            "    except OSError as e:\n        print('refused', type(e).__name__)\n"
        )
        result = run_python(code)
        assert result.ok
        assert "TOP-SECRET" not in result.stdout
        if iso.files_hidden:
            # With the mount namespace nothing of the host's /tmp, /work, /root or /etc exists.
            assert result.stdout.count("refused FileNotFoundError") == len(paths)
            assert "WORLD-READABLE" not in result.stdout and "# gspo" not in result.stdout
        solution = f"def f():\n    return open({str(secret)!r}).read()"
        assert code_reward(solution, ex(tests=["assert f() == 'TOP-SECRET-0600'"])) == 0.0
    finally:
        public.unlink()


def test_writing_outside_its_directory_has_no_effect(iso, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # even a world-writable host directory must stay untouched
    targets = [
        shared / "planted",
        Path(f"/tmp/gspo-test-planted-{os.getpid()}"),
        Path("/usr/planted"),
    ]
    code = (
        f"import os\nfor p in {[str(t) for t in targets]!r}:\n"
        "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n        print('refused', p, type(e).__name__)\n"
        "open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
    )
    result = run_python(code)
    assert result.ok and result.stdout.rstrip().endswith("fine")
    for target in targets:
        assert not target.exists(), f"{target} was created on the host"
    solution = f"def f():\n    open({str(shared / 'x')!r}, 'w').write('1')\n    return 1"
    check = f"assert f() == 1 and open({str(shared / 'x')!r}).read() == '1'"
    reward = code_reward(solution, ex(tests=[check]))
    assert not (shared / "x").exists()
    if iso.files_hidden:
        assert reward == 0.0


def test_network_is_unreachable(iso) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 53)]:\n"
        "    try:\n"
        "        s = socket.create_connection(addr, timeout=1)\n"
        "        s.sendall(b'leak'); print('connected', addr)\n"
        "    except OSError as e:\n"
        "        print('refused', type(e).__name__)\n"
    )
    try:
        result = run_python(code, config=SandboxConfig(timeout_s=10))
        assert "connected" not in result.stdout
        with pytest.raises(TimeoutError):
            server.accept()  # nobody got through to the caller's loopback
        if iso.network_blocked:
            assert result.ok and result.stdout.count("refused") == 3
        solution = (
            "import socket\ndef f():\n"
            f"    return socket.create_connection(('127.0.0.1', {port}), timeout=1) is not None"
        )
        assert code_reward(solution, ex(tests=["assert f()"])) == 0.0
    finally:
        server.close()


def test_killing_the_parent_fails_and_the_caller_survives() -> None:
    canary = subprocess.Popen(["sleep", "60"])  # a root-owned bystander
    try:
        code = (
            "import os, signal\n"
            f"for pid in (os.getppid(), {os.getpid()}, {canary.pid}, 1, -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL); print('killed', pid, flush=True)\n"
            "    except OSError as e:\n        print('refused', pid, type(e).__name__, flush=True)\n"
            "print('done', flush=True)\n"
        )
        result = run_python(code)
        assert "done" in result.stdout
        assert canary.poll() is None, "the sandbox killed a process of the caller"
        solution = f"import os\ndef f():\n    os.kill({os.getpid()}, 9)\n    return 1"
        assert code_reward(solution, ex(tests=["assert f() == 1"])) == 0.0
        assert code_reward("import os\nos.killpg(0, 9)", ex(tests=["assert True"])) == 0.0
    finally:
        canary.kill()
        canary.wait()
    assert threading.main_thread().is_alive()  # we are, evidently, still running


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


# --------------------------------------------------------------------------------------------
# The code reward
# --------------------------------------------------------------------------------------------

ASSERTS = ex(
    tests=["assert f(1) == 2", "assert f(3) == 6", "assert f(0) == 0", "assert f(5) == 10"]
)


def test_correct_program_scores_one_and_partial_gets_the_share() -> None:
    good = "Here:\n```python\ndef f(x):\n    return 2 * x\n```\nDone."
    half = "```python\ndef f(x):\n    return 2 * x if x < 2 else -1\n```"
    assert code_reward(good, ASSERTS) == 1.0
    assert code_reward(half, ASSERTS) == 0.5
    assert code_reward(half, ASSERTS, all_or_nothing=True) == 0.0
    assert code_reward("", ASSERTS) == 0.0
    assert code_reward("```python\ndef f(x) return\n```", ASSERTS) == 0.0  # syntax error
    assert get_reward("code") is code_reward


def test_stdio_tests() -> None:
    example = ex(inputs=["1 2\n", "3 4\n", "10 20\n"], outputs=["3\n", "7", "30\n"])
    for solution in (
        "a, b = map(int, input().split())\nprint(a + b)",
        "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)",
        "a, b = map(int, open(0).read().split())\nprint(a + b)\nexit()",
        "import os\na, b = map(int, input().split())\nos.write(1, str(a + b).encode())",
        "import threading\ndef main():\n    a, b = map(int, input().split())\n    print(a + b)\n"
        "threading.Thread(target=main).start()",
    ):
        assert code_reward(solution, example) == 1.0, solution
    assert code_reward("print(3)", example) == pytest.approx(1 / 3)
    assert code_reward("import sys\nprint(3)\nsys.exit(1)", example) == 0.0


def test_livecodebench_layouts() -> None:
    cases = [
        {"input": "[1, 2, 3]\n2", "output": "1", "testtype": "functional"},
        {"input": "[1, 2, 3]\n5", "output": "-1", "testtype": "functional"},
    ]
    hidden = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases[:1])))).decode()
    example = ex(
        public_test_cases=json.dumps(cases),
        private_test_cases=hidden,
        metadata=json.dumps({"func_name": "find"}),
    )
    suite = TestSuite.from_meta(example.meta)
    assert suite.kind == "call" and len(suite) == 3 and suite.expected == (1, -1, 1)
    leetcode = "```python\nclass Solution:\n    def find(self, nums, t):\n        return nums.index(t) if t in nums else -1\n```"
    assert code_reward(leetcode, example) == 1.0
    assert code_reward("def find(nums, t):\n    return 1", example) == pytest.approx(2 / 3)
    stdin_cases = json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}])
    assert code_reward("print(int(input()) ** 2)", ex(test_cases=stdin_cases)) == 1.0


def test_hostile_pickle_in_test_data_is_refused() -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch /tmp/gspo-pwned",))

    payload = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(ValueError, match="refusing to load global"):
        TestSuite.from_meta({"private_test_cases": payload, "func_name": "f"})
    assert not os.path.exists("/tmp/gspo-pwned")


def test_bad_test_data_is_an_error_that_score_counts() -> None:
    with pytest.raises(ValueError, match="no tests"):
        code_reward("print(1)", ex())
    with pytest.raises(ValueError, match="equal length"):
        TestSuite.from_meta({"inputs": ["1"], "outputs": []})
    with pytest.raises(ValueError, match="func_name"):
        TestSuite.from_meta(
            {"test_cases": [{"input": "1", "output": "1", "testtype": "functional"}]}
        )
    rewards, errors = score(code_reward, ["print(1)", "def f(x): return 2*x"], [ex(), ASSERTS])
    assert rewards == [0.0, 1.0] and errors == 1


@pytest.mark.parametrize(
    ("completion", "code"),
    [
        ("```python\nx = 1\n```", "x = 1"),
        ("```py\na\n```\ntext\n```python\nb\n```", "b"),
        ("```python\npy\n```\n```text\nnot code\n```", "py"),
        ("```\nplain\n```", "plain"),
        ("no fence\nprint(1)", "no fence\nprint(1)"),
        ("```python\ntruncated = True", "truncated = True"),
    ],
)
def test_extract_code(completion: str, code: str) -> None:
    assert extract_code(completion) == code


@pytest.mark.parametrize(
    ("actual", "expected", "match"),
    [
        ("3\n", "3", True),
        ("1  2\n3", "1 2\n3\n", True),
        ("3.0000001", "3", False),  # an integer answer is exact
        ("3.0000001", "3.0", True),  # a float answer within 1e-6
        ("3.0", "3", True),  # equal in value (LiveCodeBench's Decimal comparison)
        ("1000000999999", "1000000000000", False),  # near-miss large integer
        ("1000000000000", "1000000000000", True),
        # beyond int()'s digit limit: still exact
        pytest.param("1" * 5000, "1" * 4999 + "2", False, id="5000-digit-near-miss"),
        ("1e3", "1000", True),
        ("1000.5", "1000", False),
        ("0.333333", "0.3333333333", True),
        ("3.1", "3", False),
        ("1 2", "1 2 3", False),
        ("abc", "abd", False),
        ("nan", "nan", True),  # identical tokens
        ("inf", "1e400", False),
    ],
)
def test_outputs_match(actual: str, expected: str, match: bool) -> None:
    # Numbers written as text compare as numbers only in the "number" mode (a row's or task's
    # choice); the default compares expected text as text (tests/test_code_rows.py).
    assert outputs_match(actual, expected, "number") is match


# --------------------------------------------------------------------------------------------
# Rewards that hang
# --------------------------------------------------------------------------------------------


def hanging_reward(completion: str, example: Example) -> float:
    """Module level, so that mode='process' can pickle it."""
    if completion == "hang":
        while True:
            pass
    if completion == "sleep":
        time.sleep(60)
    if completion == "die":
        os._exit(3)
    if completion == "raise":
        raise KeyError(completion)
    return float(len(completion))


def test_score_with_timeout_counts_a_hanging_reward() -> None:
    completions = ["ab", "sleep", "abc", "raise"]
    start = time.monotonic()
    rewards, errors = score(hanging_reward, completions, [ex()] * 4, timeout_s=0.3)
    assert rewards == [2.0, 0.0, 3.0, 0.0] and errors == 2
    assert time.monotonic() - start < 0.3 + SLACK_S
    assert score(hanging_reward, ["ab"], [ex()]) == ([2.0], 0)  # the old signature still works


def test_with_timeout_thread_mode_accepts_any_callable() -> None:
    bounded = with_timeout(lambda c, e: len(c) * 1.0, 1.0)
    assert bounded("abc", ex()) == 3.0
    with pytest.raises(RewardTimeout):
        with_timeout(hanging_reward, 0.2)("sleep", ex())
    with pytest.raises(KeyError):
        with_timeout(hanging_reward, 1.0)("raise", ex())
    with pytest.raises(ValueError, match="positive"):
        with_timeout(hanging_reward, 0)


def test_with_timeout_process_mode_kills_and_recovers() -> None:
    bounded = with_timeout(hanging_reward, 0.5, mode="process")
    try:
        assert bounded("ab", ex()) == 2.0  # starts the worker (not timed)
        for hang in ("hang", "sleep"):
            start = time.monotonic()
            with pytest.raises(RewardTimeout):
                bounded(hang, ex())
            assert time.monotonic() - start < 0.5 + SLACK_S
            assert bounded("abcd", ex()) == 4.0  # a fresh worker took over
        with pytest.raises(KeyError):
            bounded("raise", ex())
        with pytest.raises(RewardWorkerError, match="exited"):
            bounded("die", ex())
        rewards, errors = score(bounded, ["hang", "abc"], [ex(), ex()])
        assert rewards == [0.0, 3.0] and errors == 1
    finally:
        bounded.close()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="picklable"):
        with_timeout(lambda c, e: 1.0, 1.0, mode="process")
    assert with_timeout(functools.partial(hanging_reward), 1.0, mode="process") is not None


# --------------------------------------------------------------------------------------------
# The built-in code task
# --------------------------------------------------------------------------------------------


def test_code_task_demos_pass_and_splits_are_disjoint() -> None:
    from gspo.envs.tasks import make_task

    task = make_task("code", n_train=40, n_test=4, difficulty=2)
    assert task.reward is code_reward
    assert {e.meta["chain"] for e in task.train}.isdisjoint(e.meta["chain"] for e in task.test)
    for example in task.test[:2]:
        assert code_reward(example.demo, example) == 1.0
    wrong = "```python\ndef f(x):\n    return 'not a number'\n```"
    assert code_reward(wrong, task.test[0]) == 0.0


UNPRIVILEGED_CALLER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from gspo.envs.sandbox import SandboxConfig, run_python
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
