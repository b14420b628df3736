"""Unit tests against model-written code: the harness that runs a :class:`TestSuite` inside
one sandboxed process (:func:`run_tests`), and the reward built on it (:func:`code_reward`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gspo.envs.sandbox.compare import (
    check_mode,
    outputs_match,
    parse_results,
    short_repr,
    values_match,
)
from gspo.envs.sandbox.config import DEFAULT_CONFIG, RunResult, SandboxConfig
from gspo.envs.sandbox.run import run_python, wall_backstop_s
from gspo.envs.sandbox.suite import TestSuite, extract_code

if TYPE_CHECKING:
    from gspo.envs.tasks.base import Example, RewardFn

logger = logging.getLogger("gspo.envs.sandbox")


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


# Runs inside the sandbox as main.py. It executes the solution once (or once per stdin test),
# and reports each test on the result channel, tagged with a per-run nonce so that text the
# solution writes there by accident or on purpose is not taken for a result. Expected outputs
# of stdio / call tests never enter the sandbox: the caller compares.
_HARNESS = r"""
import builtins, io, json, os, signal, sys, threading, time

def main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # answers may be integers of any length
    out = os.fdopen(int(os.environ.pop("GSPO_RESULT_FD")), "w", encoding="utf-8")
    with open("tests.json", encoding="utf-8") as f:
        cfg = json.load(f)
    os.remove("tests.json")
    nonce, kind, cases, limit = cfg["nonce"], cfg["kind"], cfg["cases"], cfg["timeout_s"]
    wall = cfg["wall_s"]
    value_cap = cfg["value_chars"]

    def report(i, ok, value=None, error=None):
        line = json.dumps({"nonce": nonce, "i": i, "ok": ok, "value": value, "error": error},
                          default=repr)
        out.write(line + "\n")
        out.flush()

    class TestTimeout(BaseException):
        pass

    # The limit is CPU time (ITIMER_PROF: this process, all its threads), so a test is not
    # failed because the machine is busy; the wall clock is only a backstop, far above it, for
    # code that sleeps or blocks.
    def on_cpu(signum, frame):
        raise TestTimeout(f"over the {limit} s CPU time limit")

    def on_alarm(signum, frame):
        raise TestTimeout(f"over the {wall} s wall-clock backstop")

    signal.signal(signal.SIGPROF, on_cpu)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises instead of killing

    def bounded(fn):
        signal.setitimer(signal.ITIMER_PROF, limit)
        signal.setitimer(signal.ITIMER_REAL, wall)
        try:
            value = fn()
            # Like interpreter exit, wait for threads the code started (solutions often run
            # main() in a thread with a bigger stack for deep recursion).
            end = time.monotonic() + wall
            for t in threading.enumerate():
                if t is not threading.current_thread() and not t.daemon:
                    t.join(max(0.0, end - time.monotonic()))
            return value
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.setitimer(signal.ITIMER_PROF, 0)

    def describe(exc):
        text = f"{type(exc).__name__}: {exc}"
        return text if len(text) <= 500 else text[:500] + "..."

    # Under python -S the site module's exit() / quit() are missing; solutions use them.
    builtins.exit = builtins.quit = sys.exit
    sys.argv = ["solution.py"]
    with open("solution.py", encoding="utf-8", errors="replace") as f:
        source = f.read()
    try:
        code = compile(source, "solution.py", "exec")
    except BaseException as exc:
        code = None
        if cfg["setup"] and source[:1] in (" ", "\t"):
            # A function body alone: a base model continuing HumanEval's prompt (the setup).
            try:
                code = compile(cfg["setup"] + source, "solution.py", "exec")
            except BaseException:
                pass
        if code is None:
            for i in range(len(cases)):
                report(i, False, error="does not compile: " + describe(exc))
            return
    try:
        setup = compile(cfg["setup"], "<setup>", "exec")
        test_setup = compile(cfg["test_setup"], "<test setup>", "exec")
    except BaseException as exc:
        for i in range(len(cases)):
            report(i, False, error="setup does not compile: " + describe(exc))
        return
    devnull = open(os.devnull, "w")

    if kind in ("assert", "call"):
        namespace = {"__name__": "solution", "__builtins__": builtins}
        sys.stdout = devnull  # the solution's prints are not the answer here
        stage = "setup"
        try:
            bounded(lambda: exec(setup, namespace))
            stage = "solution"
            bounded(lambda: exec(code, namespace))
            stage = "test setup"
            bounded(lambda: exec(test_setup, namespace))
            stage = "solution"
            if kind == "call":
                name = cfg["func_name"]
                cls = namespace.get("Solution")
                if isinstance(cls, type) and hasattr(cls, name):
                    target = getattr(cls(), name)
                else:
                    target = namespace[name]
        except BaseException as exc:
            for i in range(len(cases)):
                report(i, False, error=stage + " failed: " + describe(exc))
            return
        for i, case in enumerate(cases):
            try:
                if kind == "assert":
                    test = compile(case, f"<test {i}>", "exec")
                    bounded(lambda: exec(test, namespace))
                    report(i, True)
                else:
                    value = bounded(lambda: target(*case))
                    report(i, True, value=value)
            except BaseException as exc:
                report(i, False, error=describe(exc))
        return

    # stdio: a fresh namespace per test; fd 0 / fd 1 point at files so that open(0),
    # sys.stdin.buffer and os.write(1, ...) all behave as in a real run.
    for i, text in enumerate(cases):
        with open("stdin.txt", "w", encoding="utf-8") as f:
            f.write(text)
        # In this order, whichever of fd 0 / fd 1 the last test closed (open(0) does when
        # collected), each file ends up on the right descriptor.
        for path, flags, target in (
            ("stdin.txt", os.O_RDONLY, 0),
            ("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 1),
        ):
            fd = os.open(path, flags, 0o600)
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
        error = None
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        try:
            bounded(lambda: exec(setup, namespace))
            bounded(lambda: exec(code, namespace))
        except SystemExit as exc:
            if exc.code not in (None, 0):
                error = f"exit status {exc.code}"
        except BaseException as exc:
            error = describe(exc)
        try:
            sys.stdout.flush()
        except BaseException as exc:
            error = error or describe(exc)
        sys.stdout = devnull
        with open("stdout.txt", "rb") as f:
            value = f.read(value_cap).decode("utf-8", "replace")
        report(i, error is None, value=value, error=error)

main()
"""


def run_tests(
    code: str,
    suite: TestSuite,
    *,
    test_timeout_s: float = 2.0,
    total_timeout_s: float | None = None,
    config: SandboxConfig | None = None,
    compare: str = "auto",
) -> TestReport:
    """Run ``suite`` against ``code`` in one sandboxed process; never raises for the code.

    Answers compare in the suite's own mode (a row's ``compare``), else in ``compare``
    (see :mod:`gspo.envs.sandbox.compare`).

    Each test gets ``test_timeout_s`` of CPU time (an ITIMER_PROF inside the sandbox), with a
    wall-clock backstop of :func:`~gspo.envs.sandbox.run.wall_backstop_s` of it; the whole run
    gets ``total_timeout_s`` of CPU time over all its processes (default: ``test_timeout_s``
    per test plus 2 s) and its own wall-clock backstop, which also cover a solution that
    blocks the timers. Tests not reported before the run ends fail, and a run that did not
    exit by itself (killed at a limit) earns nothing, whatever it reported before: a solution
    cannot report its results and then keep running (spinning in ``atexit``, leaving
    processes behind) at the expense of the runs beside it.
    """
    if not (math.isfinite(test_timeout_s) and test_timeout_s > 0):
        raise ValueError(f"test_timeout_s must be positive, got {test_timeout_s!r}")
    n = len(suite)
    if total_timeout_s is None:
        total_timeout_s = test_timeout_s * n + 2.0
    config = dataclasses.replace(config or DEFAULT_CONFIG, timeout_s=total_timeout_s)
    mode = suite.compare or check_mode(compare)
    nonce = secrets.token_hex(16)
    # Room for the expected answer and then some, so a right answer is never cut short, and
    # the whole result channel stays under the output cap.
    longest = max((len(str(e)) for e in suite.expected), default=0)
    value_chars = max(2 * longest + 1024, 4096)
    payload = {
        "nonce": nonce,
        "kind": suite.kind,
        "cases": list(suite.cases),
        "func_name": suite.func_name,
        "timeout_s": test_timeout_s,
        # Capped by the run's own backstop when the caller set a shorter one.
        "wall_s": min(wall_backstop_s(test_timeout_s), config.wall_timeout_s or math.inf),
        "value_chars": value_chars,
        "setup": suite.setup,
        "test_setup": suite.test_setup,
    }
    run = run_python(
        _HARNESS,
        files={"solution.py": code, "tests.json": json.dumps(payload)},
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
        value = record.get("value")
        if ok and suite.kind == "stdio":
            ok = isinstance(value, str) and outputs_match(value, suite.expected[i], mode)
            error = None if ok else "wrong output"
        elif ok and suite.kind == "call":
            ok = values_match(value, suite.expected[i], mode)
            error = None if ok else f"returned {short_repr(value)}"
        passed.append(ok)
        errors.append(
            None if ok else short_repr(error, 500) if not isinstance(error, str) else error
        )
    return TestReport(tuple(passed), tuple(errors), run)


def code_reward(
    completion: str,
    example: Example,
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
    reward_fn: RewardFn,
    *,
    test_timeout_s: float = 2.0,
    total_timeout_s: float | None = None,
    memory_mb: int = DEFAULT_CONFIG.memory_mb,
    run_memory_mb: int = DEFAULT_CONFIG.run_memory_mb,
    compare: str = "auto",
) -> RewardFn:
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
