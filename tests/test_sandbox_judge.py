"""Code rewards a policy cannot game (issue 47): assert tests judged by a process the solution
cannot reach, per-test CPU limits counted from outside the program, whole outputs compared,
and a harness whose inputs say nothing about the expected outputs."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from sandbox_support import (
    ex,
    needs_full_isolation,
    needs_root,
    needs_system_python,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.sandbox import SandboxConfig, code_reward, harness
from gspo.sandbox.harness import run_tests
from gspo.sandbox.suite import TestSuite

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


HUMANEVAL_PROMPT = 'def add(a: int, b: int) -> int:\n    """a + b"""\n'
ROWS = {
    "tests": ex(tests=["assert add(1, 2) == 3", "assert add(2, 2) == 4"]),
    "humaneval": ex(
        HUMANEVAL_PROMPT,
        test="def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n",
        entry_point="add",
    ),
    "mbpp": ex(test_list=["assert add(1, 2) == 3", "assert add(2, 2) == 4"]),
}

# Each forgery is a whole solution; none computes a + b, so each must score 0.
FORGERIES = {
    "frame walking to the harness": """
        import json, os, sys
        frame = sys._getframe()
        while "nonce" not in frame.f_locals:
            frame = frame.f_back
        h = frame.f_locals
        for i in range(len(h["cases"])):
            h["out"].write(json.dumps({"nonce": h["nonce"], "i": i, "ok": True}) + "\\n")
        h["out"].flush()
        os._exit(0)
        """,
    "patched compile": """
        import builtins
        _compile = builtins.compile
        builtins.compile = lambda *a, **k: _compile("pass", "<test>", "exec")
        def add(a, b):
            return 0
        """,
    "patched json": """
        import json
        _dumps = json.dumps
        def dumps(obj, **kw):
            if isinstance(obj, dict) and "nonce" in obj:
                obj = {**obj, "ok": True, "error": None}
            return _dumps(obj, **kw)
        json.dumps = dumps
        def add(a, b):
            return 0
        """,
    "always-equal object": """
        class Same(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def add(a, b):
            return Same(0)
        """,
    "object whose comparison raises": """
        class Boom:
            def __eq__(self, other):
                raise SystemExit(0)
        def add(a, b):
            return Boom()
        """,
    "sys.exit in a test": """
        import sys
        def add(a, b):
            sys.exit(0)
        """,
    "os._exit in a test": """
        import os
        def add(a, b):
            os._exit(0)
        """,
    "fake records on every descriptor": """
        import json, os
        def add(a, b):
            line = json.dumps({"i": 0, "ok": True, "nonce": ""}).encode() + b"\\n"
            for fd in range(1, 64):
                try:
                    os.write(fd, line * 4)
                except OSError:
                    pass
            print('{"ok": true}')
            return None
        """,
}


@pytest.mark.parametrize("row", sorted(ROWS))
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_assert_tests_cannot_be_forged(row: str, forgery: str) -> None:
    needs_full_isolation("cgroup")
    assert code_reward(textwrap.dedent(FORGERIES[forgery]), ROWS[row]) == 0.0


@pytest.mark.parametrize("row", sorted(ROWS))
def test_right_and_wrong_solutions_of_each_assert_row(row: str) -> None:
    needs_full_isolation("cgroup")
    assert code_reward("def add(a, b):\n    return a + b\n", ROWS[row]) == 1.0
    assert code_reward("def add(a, b):\n    return a - b\n", ROWS[row]) == 0.0
    if row == "humaneval":  # a body alone continues the prompt
        assert code_reward("    return a + b\n", ROWS[row]) == 1.0


def test_a_solution_cannot_redefine_what_the_tests_call() -> None:
    # Builtins the tests use, and HumanEval's prompt helpers, stay the tests' own; a module
    # the solution imported (MBPP tests use `math.isclose` that way) is the judge's copy.
    needs_full_isolation("cgroup")
    row = ex(tests=["assert sorted(f(3)) == [1, 2, 3]"])
    assert code_reward("def f(n):\n    return []\ndef sorted(x):\n    return [1, 2, 3]", row) == 0
    assert code_reward("def f(n):\n    return [3, 2, 1]", row) == 1.0
    prompt = 'def poly(x):\n    return x * x\n\n\ndef root(y):\n    """poly(root(y)) == y"""\n'
    humaneval = ex(
        prompt,
        test="def check(candidate):\n    assert poly(candidate(9)) == 9\n",
        entry_point="root",
    )
    assert code_reward("def poly(x):\n    return 9\ndef root(y):\n    return 0", humaneval) == 0
    assert code_reward("def root(y):\n    return y ** 0.5", humaneval) == 1.0
    uses_math = ex(tests=["assert math.isclose(f(2), 4.0)"])
    assert code_reward("import math\ndef f(x):\n    return math.pow(x, 2)", uses_math) == 1.0


PAIR = """
class Pair(object):
    def __init__(self, a, b):
        self.a = a
        self.b = b
def max_chain_length(arr, n):
    mcl = [1 for i in range(n)]
    for i in range(1, n):
        for j in range(0, i):
            if arr[i].a > arr[j].b and mcl[i] < mcl[j] + 1:
                mcl[i] = mcl[j] + 1
    return max(mcl)
"""


def test_objects_of_the_solution_stay_in_its_process() -> None:
    # MBPP 601's tests build the solution's Pair objects and pass them back: the judge holds
    # handles, which it can pass, call and read attributes of, but which equal only
    # themselves and have no truth value.
    needs_full_isolation("cgroup")
    pairs = "[Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)]"
    mbpp = ex(test_list=[f"assert max_chain_length({pairs}, 4) == 3"])
    assert code_reward(PAIR, mbpp) == 1.0
    row = ex(tests=["assert Pair(1, 2).b == 2", "assert Pair(1, 2)", "assert Pair(1, 2) == 1"])
    report = run_tests(PAIR, TestSuite.from_meta(row.meta))
    assert report.passed == (True, False, False), report.errors


def test_the_solution_cannot_read_the_judge() -> None:
    # The judge (the solution's parent) is non-dumpable: its memory, descriptors and
    # environment are closed to the solution's uid; the tests' file is gone before the
    # solution starts.
    needs_full_isolation("cgroup")
    probe = """
        import os
        def probe():
            judge = os.getppid()
            seen = [os.path.exists("tests.json")]
            for name in ("mem", "environ", "fd/0"):
                try:
                    with open(f"/proc/{judge}/{name}", "rb") as f:
                        f.read(1)
                    seen.append(name)
                except OSError:
                    pass
            try:
                os.listdir(f"/proc/{judge}/fd")
                seen.append("fd")
            except OSError:
                pass
            return seen
        """
    row = ex(tests=["assert probe() == [False], probe()"])
    report = run_tests(textwrap.dedent(probe), TestSuite.from_meta(row.meta))
    assert report.all_passed, report.errors


# Each spends 0.6 s of CPU time in one test whose limit is 0.3 s, by a way around an
# in-process timer; the run's cgroup counter sees every process and thread.
POOLING = {
    "cancelled timer": """
        import signal, time
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, signal.SIG_IGN)
        def work():
            end = time.process_time() + 0.6
            while time.process_time() < end:
                pass
            return 1
        """,
    "forked child": """
        import os, time
        def work():
            pid = os.fork()
            if pid == 0:
                end = time.process_time() + 0.6
                while time.process_time() < end:
                    pass
                os._exit(0)
            os.waitpid(pid, 0)
            return 1
        """,
    "thread with SIGPROF blocked": """
        import signal, threading, time
        def spin():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPROF, signal.SIGALRM})
            end = time.thread_time() + 0.6
            while time.thread_time() < end:
                pass
        def work():
            t = threading.Thread(target=spin)
            t.start()
            t.join()
            return 1
        """,
    "subprocess": """
        import subprocess, sys
        def work():
            code = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"
            subprocess.run([sys.executable, "-S", "-c", code])
            return 1
        """,
}


@pytest.mark.parametrize("way", sorted(POOLING))
def test_a_test_cannot_use_more_than_its_cpu_limit(way: str) -> None:
    needs_full_isolation("cgroup")
    row = ex(tests=["assert work() == 1", "assert work() == 1"])
    report = run_tests(
        textwrap.dedent(POOLING[way]), TestSuite.from_meta(row.meta), test_timeout_s=0.3
    )
    assert report.passed == (False, False), report.errors
    # Stopped by the test's own limits: its CPU limit, or, when the machine is so busy that the
    # work gets under a tenth of a core, the wall limit tied to it (3 x CPU + 2 s) comes first.
    # Either way the pooled 0.6 s of CPU did not pass a 0.3 s limit; on an idle machine it is
    # always the CPU limit (a pooling way that escaped it would finish and pass).
    limits = ("CPU time limit", "wall-clock limit")
    assert all(any(lim in e for lim in limits) for e in report.errors if e), report.errors
    assert not report.run.timed_out  # failed per test, not by the run's own bound


@pytest.mark.slow
def test_sleeping_code_meets_the_per_test_wall_limit() -> None:
    # Sleeping uses no CPU: the wall limit of the test (3 x 0.2 s + 2 s) ends it, not the
    # run's backstop, and the next test runs in a fresh worker.
    needs_full_isolation("cgroup")
    code = (
        "import time\ndef add(a, b):\n    if a == 1:\n        time.sleep(600)\n    return a + b\n"
    )
    report = run_tests(code, TestSuite.from_meta(ROWS["tests"].meta), test_timeout_s=0.2)
    assert report.passed == (False, True), report.errors
    assert "wall-clock limit" in (report.errors[0] or "")
    assert not report.run.timed_out


def test_the_whole_output_is_compared() -> None:
    # The answer, then more than 4 KiB of whitespace, then anything: once compared on a
    # prefix (and passed), now a wrong output.
    needs_full_isolation("cgroup")
    row = ex(inputs=["1 2\n"], outputs=["3"])
    assert code_reward("print(3)", row) == 1.0
    assert code_reward("print(3)\nprint(' ' * 8192)\nprint('anything')", row) == 0.0
    # Past the cap a test fails, whatever the expected output.
    big = ex(inputs=[""], outputs=["1 " * 10])
    report = run_tests("print('1 ' * (1 << 20))", TestSuite.from_meta(big.meta))
    assert report.passed == (False,) and "output over" in (report.errors[0] or "")


def test_call_tests_compare_the_whole_value() -> None:
    needs_full_isolation("cgroup")
    row = ex(test_cases=[{"input": "1\n2", "output": "3", "testtype": "functional"}], func_name="f")
    assert code_reward("def f(a, b):\n    return a + b\n", row) == 1.0
    assert code_reward("def f(a, b):\n    return [3] + [' '] * 5000\n", row) == 0.0


def test_the_harness_input_says_nothing_about_expected_outputs(monkeypatch) -> None:
    # What enters the sandbox for two rows that differ only in their expected outputs is
    # the same, but for the nonce (the harness once sent a size derived from the longest).
    seen: list[dict] = []

    def fake_run(code, *, files, config, result_channel):
        payload = json.loads(files["tests.json"])
        payload.pop("nonce")
        seen.append({"payload": payload, "config": config, "code": code})
        raise RuntimeError("stop here")

    monkeypatch.setattr(harness, "run_python", fake_run)
    for outputs in (["3"], ["3" * 100_000]):
        suite = TestSuite.from_meta({"inputs": ["1 2\n"], "outputs": outputs})
        with pytest.raises(RuntimeError):
            run_tests("print(3)", suite)
    assert seen[0] == seen[1]
    assert "3" * 1000 not in json.dumps(seen[1]["payload"])


def test_no_result_channel_for_the_solution() -> None:
    # The solution's process holds no descriptor but stdio and its worker pipes: nothing of
    # the judge's (result channel, CPU counter) is inherited.
    needs_full_isolation("cgroup")
    code = "import os\ndef fds():\n    return sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
    row = ex(tests=["assert len(fds()) <= 6, fds()"])
    report = run_tests(code, TestSuite.from_meta(row.meta))
    assert report.all_passed, report.errors
    assert "GSPO_RESULT_FD" not in os.environ


def test_the_judge_without_namespaces() -> None:
    # The audit-hook fallback: the judge starts unhooked and hooks each worker (and each
    # stdin test's fork) before the solution runs, so the fork server still works while the
    # solution cannot start processes.
    needs_root()
    needs_system_python()
    config = SandboxConfig(namespaces=False, python="/usr/bin/python3")
    stdio = ex(inputs=["1 2\n", "3 4\n"], outputs=["3", "7"])
    assert code_reward("a, b = map(int, input().split())\nprint(a + b)", stdio, config=config) == 1
    call = ex(
        test_cases=[{"input": "1\n2", "output": "3", "testtype": "functional"}], func_name="f"
    )
    assert code_reward("def f(a, b):\n    return a + b\n", call, config=config) == 1.0
    assert code_reward("def add(a, b):\n    return a + b\n", ROWS["tests"], config=config) == 1.0
    spawns = "import subprocess\ndef add(a, b):\n    return subprocess.run(['true']).returncode + 3"
    assert code_reward(spawns, ex(tests=["assert add(1, 2) == 3"]), config=config) == 0.0


@pytest.mark.slow
def test_a_worker_killed_in_one_stdin_test_is_replaced_for_the_next() -> None:
    needs_full_isolation("cgroup")
    code = "import time\na, b = map(int, input().split())\nif a == 1:\n    time.sleep(600)\nprint(a + b)"
    row = ex(inputs=["1 2\n", "3 4\n"], outputs=["3", "7"])
    report = run_tests(code, TestSuite.from_meta(row.meta), test_timeout_s=0.2)
    assert report.passed == (False, True), report.errors
