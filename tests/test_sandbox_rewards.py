"""The code reward and bounded-time rewards: correct programs score one and partial ones
their share, stdio and LiveCodeBench test layouts, hostile or bad test data, code extraction
and output matching, rewards that hang (thread and process timeouts), and the code tasks'
demos. Split from test_sandbox; on a root Linux host every isolation mechanism is active.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pickle
import sys
import time
import zlib

import pytest
from sandbox_support import (
    SLACK_S,
    ex,
    no_leftovers,  # noqa: F401 (autouse fixture)
)

from gspo.envs.rewards import get_reward, score
from gspo.envs.tasks.base import Example
from gspo.sandbox import (
    RewardTimeout,
    RewardWorkerError,
    TestSuite,
    code_reward,
    extract_code,
    outputs_match,
    with_timeout,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


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


@pytest.mark.slow
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
