"""Reward functions and the error-tolerant batch scorer."""

from __future__ import annotations

import functools
import math
import re
import threading

import pytest

from gspo.envs.rewards import (
    REWARDS,
    combine,
    countdown_reward,
    exact_match,
    extract_boxed,
    format_reward,
    get_reward,
    math_verify_match,
    numeric_match,
    overlong_penalty,
    score,
)
from gspo.envs.tasks.base import Example


def ex(answer: str, **meta: object) -> Example:
    return Example(prompt="q", answer=answer, meta=dict(meta))


def test_exact_match_strips_whitespace_only() -> None:
    assert exact_match(" 82\n", ex("82")) == 1.0
    assert exact_match("82", ex(" 82 ")) == 1.0
    assert exact_match("820", ex("82")) == 0.0
    assert exact_match("8 2", ex("82")) == 0.0


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("The answer is 1,234, so done", "1234", 1.0),
        ("total: 1,234,567", "1234567", 1.0),
        ("x = -5.", "-5", 1.0),
        ("10-3", "3", 1.0),  # a binary minus is not a sign
        ("it is 3.50", "3.5", 1.0),
        ("it is .5", "0.5", 1.0),
        ("first 7 then 8", "7", 0.0),  # the last number counts
        ("#### 72\nand later 5", "72", 1.0),  # #### wins over later numbers
        ("work 3 4\n#### 1,000", "1000", 1.0),
        ("reasoning... #### 72", "Natalia sold 48 ... #### 72", 1.0),
        ("no number here", "1", 0.0),
        ("", "0", 0.0),
        ("0.1", "0.1000000001", 1.0),  # within 1e-6 relative
        ("0.1", "0.1001", 0.0),
        ("0", "0", 1.0),
        ("1" * 400, "1" * 400, 1.0),  # too big for a float
        ("1" * 5000, "1", 0.0),  # too long for int(); not an error
    ],
)
def test_numeric_match(completion: str, answer: str, expected: float) -> None:
    assert numeric_match(completion, ex(answer)) == expected


def test_numeric_match_answer_without_number_scores_zero() -> None:
    assert numeric_match("42", ex("forty-two")) == 0.0
    assert numeric_match("42", ex("42")) == 1.0  # the same completion scores 1 against a number


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"so the answer is \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        ("#### 1/2", "0.5", 1.0),
        (r"\boxed{x^2+1}", "1+x^2", 1.0),
        (r"\boxed{0.3}", "0.5", 0.0),
        ("#### 3", "4", 0.0),
        ("0.5", "0.5", 0.0),  # no \boxed{} and no ####: no answer given
        (r"\boxed{}", "0", 0.0),
        (r"\boxed{3} no wait #### 4", "4", 1.0),  # the later of the two counts
        (r"\boxed{\frac{1}{2", "0.5", 0.0),  # unbalanced box
    ],
)
def test_math_verify_match(completion: str, answer: str, expected: float) -> None:
    assert math_verify_match(completion, ex(answer)) == expected


def test_math_verify_match_works_off_the_main_thread() -> None:
    # math-verify's default SIGALRM timeouts raise outside the main thread.
    results: list[object] = []

    def work() -> None:
        try:
            results.append(math_verify_match(r"\boxed{\frac{1}{2}}", ex("0.5")))
        except BaseException as e:  # recorded, so the assertion below shows it
            results.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert results == [1.0]


def test_math_verify_match_never_raises_on_garbage() -> None:
    for completion in [r"\boxed{\frac{}{}}", r"\boxed{)(}", "#### \\\\\\", r"\boxed{1/0}"]:
        assert math_verify_match(completion, ex("1")) in (0.0, 1.0)


def test_extract_boxed_handles_nested_braces() -> None:
    assert extract_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert extract_boxed("nothing") is None


def test_format_reward_default_and_named_patterns() -> None:
    assert format_reward(r"so \boxed{42}") == 1.0
    assert format_reward("work\n#### 42") == 1.0
    assert format_reward("the answer is 42") == 0.0
    assert format_reward(r"\boxed{ }") == 0.0
    assert format_reward("####\n") == 0.0
    # A hashes line without an answer is not the format (a policy learned to emit only that).
    assert format_reward("####\n##### MULTACYL") == 0.0
    assert format_reward("#### MULT") == 0.0
    assert format_reward("#### -3.5") == 1.0
    assert format_reward("x #### 42") == 0.0  # must start a line
    assert format_reward("#### 42", pattern="boxed") == 0.0
    assert format_reward(r"\boxed{42}", pattern="hashes") == 0.0
    assert format_reward(r"\boxed{42}", pattern="boxed") == 1.0
    assert format_reward("#### 42", pattern="hashes") == 1.0
    assert format_reward("<a>42</a>", ex("42"), pattern=re.compile(r"<a>\d+</a>")) == 1.0
    boxed_only = functools.partial(format_reward, pattern="boxed")
    assert boxed_only(r"\boxed{1}", ex("1")) == 1.0
    with pytest.raises(ValueError, match="boxed_or_hashes"):
        format_reward("x", pattern="nope")


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (16384, 0.0), (18432, -0.5), (20480, -1.0), (20481, -1.0), (10**6, -1.0)],
)
def test_overlong_penalty_dapo_values(length: int, expected: float) -> None:
    assert overlong_penalty(length, 20480, 4096) == expected


def test_overlong_penalty_is_linear_in_the_buffer() -> None:
    assert overlong_penalty(16385, 20480, 4096) == -1 / 4096
    assert overlong_penalty(10, 10, 10) == -1.0
    assert overlong_penalty(5, 10, 10) == -0.5


@pytest.mark.parametrize(("max_length", "cache_length"), [(100, 0), (100, -1), (100, 101), (0, 0)])
def test_overlong_penalty_validates(max_length: int, cache_length: int) -> None:
    with pytest.raises(ValueError):
        overlong_penalty(5, max_length, cache_length)


def test_combine_is_a_weighted_sum() -> None:
    reward = combine((exact_match, 1.0), (format_reward, 0.5))
    assert reward("82", ex("82")) == 1.0
    assert reward(r"\boxed{82}", ex("82")) == 0.5
    assert reward("x", ex("82")) == 0.0
    with pytest.raises(ValueError):
        combine()
    with pytest.raises(ValueError):
        combine((exact_match, math.nan))


def test_score_counts_and_zeroes_bad_rewards() -> None:
    outputs: dict[str, object] = {
        "good": 0.75,
        "none": None,
        "nan": math.nan,
        "inf": math.inf,
        "str": "1.0",
        "true": True,
        "int": 2,
        "complex": 1j,
        "list": [1.0],
        "huge": 10**400,
    }

    def flaky(completion: str, example: Example) -> object:
        if completion == "raise":
            raise RuntimeError("boom")
        return outputs[completion]

    completions = [*outputs, "raise"]
    rewards, n_errors = score(flaky, completions, [ex("a")] * len(completions))  # type: ignore[arg-type]
    assert rewards == [0.75, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    assert n_errors == 8
    assert all(type(r) is float for r in rewards)


def test_score_survives_sys_exit_and_keeps_good_samples() -> None:
    def reward(completion: str, example: Example) -> float:
        if completion == "exit":
            raise SystemExit(1)
        return exact_match(completion, example)

    rewards, n_errors = score(reward, ["82", "exit", "81"], [ex("82")] * 3)
    assert (rewards, n_errors) == ([1.0, 0.0, 0.0], 1)


def test_score_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        score(exact_match, ["a"], [])


def test_countdown_reward() -> None:
    problem = ex("22", numbers=[3, 5, 7], target=22)
    assert countdown_reward("3*5+7", problem) == 1.0
    assert countdown_reward(" (5*3)+7 ", problem) == 1.0
    assert countdown_reward("3*5+7+7-7", problem) == 0.0  # 7 used three times
    assert countdown_reward("3*5+6+1", problem) == 0.0  # numbers not given
    assert countdown_reward("3*5+7.0", problem) == 0.0
    assert countdown_reward("-3*-5+7", problem) == 0.0  # unary minus is not allowed
    assert countdown_reward("3**2", problem) == 0.0
    assert countdown_reward("7/(5-5)", problem) == 0.0
    assert countdown_reward("__import__('os')", problem) == 0.0
    assert countdown_reward("22", problem) == 0.0
    assert countdown_reward("", problem) == 0.0
    assert countdown_reward("(" * 500 + "3" + ")" * 500, problem) == 0.0
    # Exact arithmetic: 7/3*3 is 7, not 6.999...
    assert countdown_reward("7/3*3", ex("7", numbers=[7, 3, 3], target=7)) == 1.0
    # Numbers may also come as a comma-separated string (from a user data file).
    assert countdown_reward("3*5+7", ex("22", numbers="3,5,7")) == 1.0


def test_registry() -> None:
    assert {"exact_match", "numeric", "math_verify", "format"} <= set(REWARDS)
    assert get_reward("numeric") is numeric_match
    with pytest.raises(ValueError, match="exact_match"):
        get_reward("nope")


# --------------------------------------------------------------------------------------------
# Parallel scoring
# --------------------------------------------------------------------------------------------


def test_score_workers_run_calls_at_once_bounded_and_in_order() -> None:
    from gspo.envs.rewards import reward_workers, score

    lock = threading.Lock()
    running = [0, 0]  # now, most at once
    barrier = threading.Barrier(3, timeout=10)

    def reward(completion: str, example: Example) -> float:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        try:
            if completion.startswith("meet"):
                barrier.wait()  # only returns once three calls run at the same time
            if completion == "raise":
                raise ValueError("bad")
            return float(len(completion))
        finally:
            with lock:
                running[0] -= 1

    completions = ["meet1", "meet22", "meet333", "raise", "a", "bb", "ccc", "dddd", "e"]
    rewards, errors = score(reward, completions, [Example("", "")] * 9, workers=3)
    assert rewards == [5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 4.0, 1.0] and errors == 1
    assert running[1] == 3  # three at once, never more
    sequential = score(reward, completions[3:], [Example("", "")] * 6)
    assert sequential == ([0.0, 1.0, 2.0, 3.0, 4.0, 1.0], 1)
    with pytest.raises(ValueError, match="workers"):
        score(reward, ["a"], [Example("", "")], workers=0)
    assert reward_workers(reward) == 1 and reward_workers(reward, 5) == 5


def test_reward_workers_finds_the_sandbox_inside_wrappers() -> None:
    import os

    from gspo.envs.rewards import MAX_AUTO_REWARD_WORKERS, combine, format_reward, reward_workers
    from gspo.sandbox import code_reward, with_timeout

    auto = max(1, min(MAX_AUTO_REWARD_WORKERS, os.cpu_count() or 1))
    for fn in (
        code_reward,
        functools.partial(code_reward, all_or_nothing=True),
        combine((code_reward, 1.0), (format_reward, 0.1)),
        with_timeout(code_reward, 5.0),
    ):
        assert reward_workers(fn) == auto, fn
    assert reward_workers(exact_match) == 1
    assert reward_workers(combine((exact_match, 1.0), (format_reward, 0.1))) == 1
