"""Unit tests against model-written code: the harness that runs a :class:`TestSuite` inside
one sandboxed process (:func:`run_tests`), and the reward built on it (:func:`code_reward`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import marshal
import math
import os
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gspo.sandbox.compare import (
    check_mode,
    loads,
    outputs_match,
    parse_results,
    short_repr,
    values_match,
)
from gspo.sandbox.config import DEFAULT_CONFIG, RunResult, SandboxConfig
from gspo.sandbox.run import AUDIT_HOOK, run_python
from gspo.sandbox.suite import TestSuite, extract_code

logger = logging.getLogger("gspo.sandbox")


class ExampleRow(Protocol):
    """What :func:`code_reward` reads of a task's example (``gspo.envs.tasks.Example`` is one).
    The sandbox is a layer below the environments, so it names their type by its shape only."""

    @property
    def prompt(self) -> str: ...

    @property
    def meta(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class TestReport:
    """Outcome of running a :class:`TestSuite` against one program."""

    passed: tuple[bool, ...]
    errors: tuple[str | None, ...]
    """Why each failed test failed (None for a pass), for logs and debugging."""
    run: RunResult

    __test__ = False

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


TEST_WALL_FACTOR = 3.0
TEST_WALL_SLACK_S = 2.0
OUTPUT_CAP_BYTES = 1 << 20
"""A test's whole stdout must fit in this (1 MiB) or the test fails; it depends on nothing
of the expected outputs."""
RESULT_CAP_BYTES = 16 << 20
"""What a run's results may hold in all (at least the run's ``max_output_bytes``); a run
whose results exceed it earns nothing."""


def _program() -> str:
    """The harness program: judge_worker.py, then judge.py without its import of it."""
    here = Path(__file__).parent
    worker = (here / "judge_worker.py").read_text(encoding="utf-8")
    judge = (here / "judge.py").read_text(encoding="utf-8")
    before, rest = judge.split("# <worker>\n", 1)
    return worker + "\n\n" + before + rest.split("# </worker>\n", 1)[1]


_JUDGE_SOURCE = _program()
# Compiling the program takes longer than starting it: with the caller's own interpreter in
# the sandbox, the run gets it compiled (a marshalled code object) and a loader as main.py.
_LOADER = (
    "import marshal\n"
    "with open('judge.bin', 'rb') as f:\n"
    "    code = marshal.load(f)\n"
    "exec(code, {'__name__': '__main__', '__builtins__': __builtins__})\n"
)


@functools.cache
def _compiled() -> bytes:
    return marshal.dumps(compile(_JUDGE_SOURCE, "judge.py", "exec"))


def _program_files(config: SandboxConfig) -> tuple[str, dict[str, str | bytes]]:
    """main.py and the files that carry the harness program into the run."""
    if config.python and os.path.realpath(config.python) != os.path.realpath(sys.executable):
        return _JUDGE_SOURCE, {}
    return _LOADER, {"judge.bin": _compiled(), "judge.py": _JUDGE_SOURCE}


def test_wall_s(cpu_s: float) -> float:
    """The wall-clock limit of one test with a CPU-time limit of ``cpu_s``: 3 x + 2 s, so
    that a program that sleeps or blocks holds a worker that long at most per test."""
    return TEST_WALL_FACTOR * cpu_s + TEST_WALL_SLACK_S


test_wall_s.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def run_tests(
    code: str,
    suite: TestSuite,
    *,
    test_timeout_s: float = 2.0,
    total_timeout_s: float | None = None,
    config: SandboxConfig | None = None,
    compare: str = "auto",
) -> TestReport:
    """Run ``suite`` against ``code`` in one sandboxed run; never raises for the code.

    Answers compare in the suite's own mode (a row's ``compare``), else in ``compare``
    (see :mod:`gspo.sandbox.compare`), here in the caller. Inside the run, the harness
    (:mod:`gspo.sandbox.judge`) runs the solution in processes of its own: assert tests
    are evaluated by the harness, which exchanges only plain values with the solution, so
    nothing the solution does decides a verdict.

    Each test gets ``test_timeout_s`` of CPU time, counted over every process of the run (its
    cgroup's counter), and :func:`test_wall_s` of it of wall-clock time; a test over either
    fails and its processes are killed. The whole run gets ``total_timeout_s`` of CPU time
    (default: ``test_timeout_s`` plus 0.2 s of start-up per test, plus 2 s) and a wall-clock
    backstop of :func:`test_wall_s` per test plus 10 s. A stdout over
    :data:`OUTPUT_CAP_BYTES` fails its test. Tests not reported before the run ends fail,
    and a run that did not exit by itself (killed at a limit) earns nothing.
    """
    if not (math.isfinite(test_timeout_s) and test_timeout_s > 0):
        raise ValueError(f"test_timeout_s must be positive, got {test_timeout_s!r}")
    n = len(suite)
    if total_timeout_s is None:
        total_timeout_s = (test_timeout_s + 0.2) * n + 2.0
    config = config or DEFAULT_CONFIG
    config = dataclasses.replace(
        config,
        timeout_s=total_timeout_s,
        wall_timeout_s=config.wall_timeout_s or test_wall_s(test_timeout_s) * n + 10.0,
        max_output_bytes=max(config.max_output_bytes, RESULT_CAP_BYTES),
    )
    mode = suite.compare or check_mode(compare)
    nonce = secrets.token_hex(16)
    payload = {
        "nonce": nonce,
        "kind": suite.kind,
        "cases": list(suite.cases),
        "func_name": suite.func_name,
        "entry_point": suite.entry_point,
        "timeout_s": test_timeout_s,
        "wall_s": min(test_wall_s(test_timeout_s), config.wall_timeout_s),
        "output_bytes": OUTPUT_CAP_BYTES,
        "code": code,
        "setup": suite.setup,
        "fixture": suite.fixture,
        "test_setup": suite.test_setup,
        "audit_hook": AUDIT_HOOK,
    }
    program, files = _program_files(config)
    run = run_python(
        program,
        files={**files, "tests.json": json.dumps(payload)},
        config=config,
        result_channel=True,
    )
    reports, problems = parse_results(run.result, nonce, n)
    passed: list[bool] = []
    errors: list[str | None] = []
    if run.timed_out or run.output_limit:
        limit = "its time limit" if run.timed_out else "its output limit"
        reason = f"the run did not exit by itself (killed at {limit}); it earns nothing"
        return TestReport((False,) * n, (reason,) * n, run)
    for i in range(n):
        record = reports.get(i)
        if record is None:
            reason = "no result"
            if run.error:
                reason = run.error
            elif run.returncode not in (0, None):
                reason = f"harness exited with status {run.returncode}: {run.stderr[-300:]}"
            if problems:
                reason += "; malformed result records: " + "; ".join(problems)
            passed.append(False)
            errors.append(reason)
            continue
        ok = record["ok"]
        error = record.get("error")
        if ok and suite.kind == "stdio":
            value = record.get("value")
            ok = isinstance(value, str) and outputs_match(value, suite.expected[i], mode)
            error = None if ok else "wrong output"
        elif ok and suite.kind == "call":
            try:
                value = loads(record.get("json"))
            except (TypeError, ValueError, RecursionError, ArithmeticError) as exc:
                ok, error = False, f"return value not readable: {type(exc).__name__}"
            else:
                ok = values_match(value, suite.expected[i], mode)
                error = None if ok else f"returned {short_repr(value)}"
        passed.append(ok)
        errors.append(
            None if ok else short_repr(error, 500) if not isinstance(error, str) else error
        )
    return TestReport(tuple(passed), tuple(errors), run)


def code_reward(
    completion: str,
    example: ExampleRow,
    *,
    all_or_nothing: bool = False,
    test_timeout_s: float = 2.0,
    total_timeout_s: float | None = None,
    config: SandboxConfig | None = None,
    compare: str = "auto",
) -> float:
    """Share of the example's unit tests that the completion's code passes, in the sandbox.

    The code is :func:`extract_code` of the completion (for HumanEval rows, the last block
    defining the ``entry_point``); the tests come from ``example.meta`` (see
    :meth:`TestSuite.from_meta`; HumanEval rows run the example's prompt first when it is
    Python). With ``all_or_nothing``, 1.0 only if every test passes. ``compare`` is the task's
    comparison mode (a row's ``compare`` field wins). No code scores 0.0. Example data without
    usable tests raises ValueError (a data problem, which :func:`gspo.envs.rewards.score` counts as
    an error). Select options for a registry with
    ``functools.partial(code_reward, all_or_nothing=True)``.
    """
    suite = TestSuite.from_meta(example.meta, prompt=example.prompt)
    entry_point = example.meta.get("entry_point")
    code = extract_code(completion, entry_point if isinstance(entry_point, str) else None)
    if not code.strip():
        return 0.0
    report = run_tests(
        code,
        suite,
        test_timeout_s=test_timeout_s,
        total_timeout_s=total_timeout_s,
        config=config,
        compare=compare,
    )
    if report.run.error is not None:
        logger.warning("code_reward: sandbox problem: %s", report.run.error)
    return (1.0 if report.all_passed else 0.0) if all_or_nothing else report.fraction


code_reward.uses_sandbox = True  # type: ignore[attr-defined]  # gspo.envs.rewards.reward_workers


def with_code_limits(
    reward_fn: Callable[[str, Any], float],
    *,
    test_timeout_s: float = 2.0,
    total_timeout_s: float | None = None,
    memory_mb: int = DEFAULT_CONFIG.memory_mb,
    run_memory_mb: int = DEFAULT_CONFIG.run_memory_mb,
    compare: str = "auto",
) -> Callable[[str, Any], float]:
    """``reward_fn`` with these limits if it is :func:`code_reward` or a ``functools.partial``
    of it (whose own keywords win: a task's choice stays; the memory limits go into its own
    ``config`` when it has one), else ``reward_fn`` unchanged. Used by the trainer for the
    run's ``code_*`` config fields."""
    if reward_fn is code_reward:
        args: tuple = ()
        keywords: dict = {}
    elif isinstance(reward_fn, functools.partial) and reward_fn.func is code_reward:
        args, keywords = reward_fn.args, dict(reward_fn.keywords)
    else:
        return reward_fn
    config = dataclasses.replace(
        keywords.pop("config", None) or DEFAULT_CONFIG,
        memory_mb=memory_mb,
        run_memory_mb=run_memory_mb,
    )
    config.validate()
    options = {
        "test_timeout_s": test_timeout_s,
        "total_timeout_s": total_timeout_s,
        "compare": check_mode(compare),
        "config": config,
    }
    return functools.partial(code_reward, *args, **{**options, **keywords})
