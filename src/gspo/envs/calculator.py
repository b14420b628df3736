"""Built-in task 1: multiply two 3- or 4-digit numbers with a calculator tool.

The tiny models cannot multiply such numbers in their heads; with the calculator they only
have to call it and copy its answer. Plain-text form (tiny char models)::

    prompt  "123*456="
    turn 1  "[[calc:123*456]]"        env  " => 56088 "
    turn 2  "56088" <eos>             reward 1 if the final turn is exactly the product

Chat models use the Qwen ``<tool_call>`` JSON convention with the same tool (``calc``, argument
``expression``). The demonstrations (``Example.demo``, for the SFT cold start) are the whole
plain-text episode after the prompt, the calculator's reply included: the supervised loss
covers those reply tokens too (SFT has no loss mask), which the RL phase then never trains on.
"""

from __future__ import annotations

import functools
import random
from typing import TYPE_CHECKING

from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.synthetic import DIFFICULTIES, TASKS, _build, _Spec

from .base import register_env
from .tool_env import ToolEnv
from .tools import CALCULATOR

if TYPE_CHECKING:  # the config validates tasks against gspo.envs: only a type here, no cycle
    from gspo.config.options_task import TaskOptions


def final_answer_reward(completion: str, example: Example) -> float:
    """1.0 when the (final) turn is exactly the answer, whitespace aside."""
    return float(completion.strip() == example.answer)


def _sample(rng: random.Random, digits: int) -> Example:
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    answer = str(a * b)
    demo = f"[[calc:{a}*{b}]] => {answer} {answer}"
    return Example(prompt=f"{a}*{b}=", answer=answer, demo=demo, meta={"a": a, "b": b})


SPEC = _Spec(
    name="calculator",
    description=(
        "Multiply two numbers with a calculator tool: '123*456=' -> '[[calc:123*456]]', "
        "reply ' => 56088', then '56088'. Difficulty = digits per operand (3 or 4)."
    ),
    default=3,
    low=2,
    high=4,
    sample=_sample,
    space=lambda d: (9 * 10 ** (d - 1)) ** 2,
    reward=final_answer_reward,
)
TASKS["calculator"] = functools.partial(_build, SPEC)


def _sample_direct(rng: random.Random, digits: int) -> Example:
    example = _sample(rng, digits)
    return Example(example.prompt, example.answer, demo=example.answer, meta=example.meta)


# The no-tool baseline: the same problems (same splits), answered in one turn without tools.
NO_TOOL_SPEC = _Spec(
    name="multiply",
    description=(
        "Multiply two numbers in one turn, no tools: '123*456=' -> '56088' (the calculator "
        "task's no-tool baseline). Difficulty = digits per operand."
    ),
    default=3,
    low=2,
    high=4,
    sample=_sample_direct,
    space=SPEC.space,
    reward=final_answer_reward,
)
TASKS["multiply"] = functools.partial(_build, NO_TOOL_SPEC)
DIFFICULTIES["calculator"] = (SPEC.low, SPEC.default, SPEC.high)
DIFFICULTIES["multiply"] = (NO_TOOL_SPEC.low, NO_TOOL_SPEC.default, NO_TOOL_SPEC.high)


@register_env("calculator")
def calculator_env(task: Task, opts: TaskOptions, chat: bool) -> ToolEnv:
    return ToolEnv(
        "calculator",
        [CALCULATOR],
        final_answer_reward,
        plain=not chat,
        tool_timeout_s=opts.tool_timeout_s or 0.0,
        error_penalty=0.1,
    )
