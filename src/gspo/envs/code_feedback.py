"""Built-in task 3: code with execution feedback.

The problems of the ``code`` task (write ``f(x)`` applying a chain of integer operations),
multi-turn: each policy turn is a program, run against the unit tests in the sandbox
(:func:`gspo.sandbox.run_tests`). All tests passing ends the episode with reward 1; otherwise
the failing tests' messages go back to the policy, which may retry ``retries`` times; after the
last attempt the reward is the share of tests passed. A chat-model task: programs need
newlines, which the tiny char models' charset lacks.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.code import SPEC as CODE_SPEC
from gspo.envs.tasks.synthetic import DIFFICULTIES, TASKS, _build
from gspo.sandbox import TestSuite, extract_code, run_tests

from .base import Step, register_env

SPEC = dataclasses.replace(CODE_SPEC, name="code_feedback")
TASKS["code_feedback"] = functools.partial(_build, SPEC)
DIFFICULTIES["code_feedback"] = (SPEC.low, SPEC.default, SPEC.high)


@dataclass
class _State:
    example: Example
    attempts: int = 0


class CodeFeedbackEnv:
    multi_turn = True
    stop_strings: tuple[str, ...] = ()

    def __init__(self, *, retries: int = 2, test_timeout_s: float = 2.0) -> None:
        self.name = "code_feedback"
        self.retries = retries
        self.test_timeout_s = test_timeout_s

    def reset(self, example: Example) -> _State:
        return _State(example)

    def step(self, state: _State, text: str, finished: bool) -> Step:
        state.attempts += 1
        suite = TestSuite.from_meta(state.example.meta, prompt=state.example.prompt)
        entry_point = state.example.meta.get("entry_point")
        code = extract_code(text, entry_point if isinstance(entry_point, str) else None)
        if not code.strip():
            report = None
        else:
            report = run_tests(code, suite, test_timeout_s=self.test_timeout_s)
        fraction = report.fraction if report is not None else 0.0
        passed = report is not None and report.all_passed
        if passed or state.attempts > self.retries:  # success: every test passed
            return Step(done=True, reward=fraction, success=passed)
        if report is None:
            feedback = "No code found. Answer with the code in a ```python block."
        else:
            failed = [
                f"{case}: {err}"
                for case, ok, err in zip(suite.cases, report.passed, report.errors, strict=True)
                if not ok
            ]
            feedback = (
                f"{len(failed)} of {len(suite)} tests failed:\n" + "\n".join(failed[:3])[:600]
            )
        return Step(done=False, messages=[{"role": "user", "content": feedback}])


@register_env("code_feedback")
def code_feedback_env(task: Task, opts, chat: bool) -> CodeFeedbackEnv:
    return CodeFeedbackEnv()
