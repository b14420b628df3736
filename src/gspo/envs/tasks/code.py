"""A tiny programming task: write ``f(x)`` applying a chain of integer operations.

Each problem describes ``difficulty`` operations on an integer, in words, and asks for a Python
function in a fenced block::

    Write a Python function f(x) that takes an integer x, adds 7, then multiplies by 3,
    and returns the final value. Answer with the code in a ```python block.

The reward is :func:`gspo.sandbox.code_reward`: the completion's code runs in the sandbox
against five ``assert f(v) == ...`` tests and scores the share passed. It is a smoke test of
the code-execution path for real tokenizers (prompts and answers need newlines), not a
benchmark. Splits are disjoint by the operation chain. Difficulty = number of operations, 1..4.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from gspo.envs.tasks.base import Example
from gspo.envs.tasks.synthetic import DIFFICULTIES, TASKS, _build, _Spec
from gspo.sandbox import code_reward

__all__ = ["NAME", "sample_code_problem"]

NAME = "code"

# (words, Python statement, function) for each operation; {n} is the operand.
_OPS: list[tuple[str, str, Callable[[int, int], int]]] = [
    ("adds {n}", "x = x + {n}", lambda x, n: x + n),
    ("subtracts {n}", "x = x - {n}", lambda x, n: x - n),
    ("multiplies by {n}", "x = x * {n}", lambda x, n: x * n),
    ("takes the remainder modulo {n}", "x = x % {n}", lambda x, n: x % n),
    ("floor-divides by {n}", "x = x // {n}", lambda x, n: x // n),
]
_OPERANDS = range(2, 10)
_TEST_INPUTS = (0, 1, 5, -3, 12)


def sample_code_problem(rng: random.Random, difficulty: int) -> Example:
    """One problem with ``difficulty`` operations."""
    ops = [(rng.randrange(len(_OPS)), rng.choice(_OPERANDS)) for _ in range(difficulty)]
    words = [_OPS[i][0].format(n=n) for i, n in ops]
    description = words[0] if len(words) == 1 else ", then ".join(words)
    prompt = (
        f"Write a Python function f(x) that takes an integer x, {description}, and returns the "
        "final value. Answer with the code in a ```python block."
    )
    body = "\n".join(f"    {_OPS[i][1].format(n=n)}" for i, n in ops)
    demo = f"```python\ndef f(x):\n{body}\n    return x\n```"

    def reference(x: int) -> int:
        for i, n in ops:
            x = _OPS[i][2](x, n)
        return x

    tests = [f"assert f({v}) == {reference(v)}" for v in _TEST_INPUTS]
    chain = ";".join(f"{i}:{n}" for i, n in ops)
    return Example(
        prompt=prompt,
        answer=demo,
        demo=demo,
        meta={"tests": tests, "chain": chain, "difficulty": difficulty},
    )


SPEC = _Spec(
    name=NAME,
    description=(
        "Write f(x) applying a chain of integer operations, checked by unit tests run in the "
        "sandbox (gspo.sandbox). Difficulty = number of operations (1..4)."
    ),
    default=2,
    low=1,
    high=4,
    sample=sample_code_problem,
    space=lambda difficulty: (len(_OPS) * len(_OPERANDS)) ** difficulty,
    reward=code_reward,
    key=lambda example: example.meta["chain"],
)

TASKS[NAME] = functools.partial(_build, SPEC)
DIFFICULTIES[NAME] = (SPEC.low, SPEC.default, SPEC.high)
