"""A task where response length matters: a chain of last-digit operations, answered directly or
with a scratchpad of intermediate results.

Prompt ``"3*7+4*3+8="``: start from the first digit and apply the operations left to right,
keeping only the last digit after each one (3*7=21 -> 1, 1+4 -> 5, 5*3=15 -> 5, 5+8=13 -> 3).
The answer is ``"3"``. A completion may answer directly (``"3"``, the *short* form) or write every
intermediate digit first (``"1,5,5,3"``, the *long* form). The reward checks only the final
answer, the text after the last ``,`` of the completion (the whole completion when it has none),
so both forms earn the same reward when right.

Why the scratchpad helps a tiny model: in the long form every step is one table look-up of
(previous digit, operation, operand), and the operation and operand of step k sit a fixed
number of positions before the output of step k (the prompt has one character per digit or
operator, the scratchpad one per digit or comma). The short form must compose all the
operations at once, which a two-layer model does poorly. Multipliers are 3, 7 and 9 (units mod
10), so no operation wipes out the history. (A first version summed digits; a tiny model adds
digits directly with attention better than it learns the scratchpad, so it was dropped.)

The cold-start demonstrations mix both forms (:data:`LONG_FRACTION` long), so RL starts from a
policy that writes both, and the share of long answers and the mean response length are what
an algorithm's length dynamics move. Difficulty = number of operations (2..10; the long form
is 2 x operations - 1 characters, 19 at most). The task is registered as ``"scratchpad"`` in
:data:`gspo.envs.tasks.synthetic.TASKS`, which draws the splits (stable-hash disjoint by prompt,
seeded).
"""

from __future__ import annotations

import random

from gspo.envs.tasks.base import Example

__all__ = [
    "DEFAULT_OPS",
    "LONG_FRACTION",
    "MAX_OPS",
    "MIN_OPS",
    "MULTIPLIERS",
    "final_answer",
    "long_form",
    "run_chain",
    "sample_scratchpad",
    "scratchpad_key",
    "scratchpad_reward",
    "scratchpad_space",
]

MIN_OPS = 2
DEFAULT_OPS = 6
MAX_OPS = 10
MULTIPLIERS = (3, 7, 9)
"""Operands of ``*``: units modulo 10, so every step is a bijection of the last digit."""
ADDENDS = tuple(range(1, 10))
"""Operands of ``+``."""
LONG_FRACTION = 0.5
"""Share of cold-start demonstrations written in the long (scratchpad) form."""

DESCRIPTION = (
    "Apply last-digit operations left to right: '3*7+4*3+8=' -> '3', directly or with the "
    "intermediate digits '1,5,5,3' (only the text after the last ',' is scored; cold-start demos "
    "mix both forms). Difficulty = number of operations."
)


def run_chain(start: int, ops: list[tuple[str, int]]) -> list[int]:
    """The last digit after each operation, in order."""
    value, out = start, []
    for op, operand in ops:
        if op == "+":
            value = (value + operand) % 10
        elif op == "*":
            value = (value * operand) % 10
        else:
            raise ValueError(f"unknown operation {op!r}; valid: + *")
        out.append(value)
    return out


def long_form(start: int, ops: list[tuple[str, int]]) -> str:
    """The scratchpad completion: every intermediate digit, comma-separated (ends with the answer)."""
    if not ops:
        raise ValueError("need at least one operation")
    return ",".join(map(str, run_chain(start, ops)))


def sample_scratchpad(
    rng: random.Random, count: int, long_fraction: float = LONG_FRACTION
) -> Example:
    """Draw one problem of ``count`` operations; its demo is long with probability ``long_fraction``."""
    start = rng.randint(0, 9)
    ops = []
    for _ in range(count):
        if rng.random() < 0.5:
            ops.append(("+", rng.choice(ADDENDS)))
        else:
            ops.append(("*", rng.choice(MULTIPLIERS)))
    answer = str(run_chain(start, ops)[-1])
    form = "long" if rng.random() < long_fraction else "short"
    demo = long_form(start, ops) if form == "long" else answer
    prompt = str(start) + "".join(f"{op}{d}" for op, d in ops) + "="
    meta = {"difficulty": count, "start": start, "ops": ops, "form": form}
    return Example(prompt=prompt, answer=answer, demo=demo, meta=meta)


def scratchpad_key(example: Example) -> str:
    """The split key: the prompt (operations do not commute, so each chain is its own problem)."""
    return example.prompt


def scratchpad_space(count: int) -> int:
    """Every prompt of ``count`` operations has probability at least 1 / (10 x 18^count)."""
    return 10 * (2 * max(len(ADDENDS), len(MULTIPLIERS))) ** count


def final_answer(completion: str) -> str:
    """The text after the last ``,`` (the whole completion when there is none), stripped."""
    return completion.rsplit(",", 1)[-1].strip()


def scratchpad_reward(completion: str, example: Example) -> float:
    """1.0 when the final answer is the reference digit, else 0.0; the scratchpad is not checked."""
    return 1.0 if final_answer(completion) == example.answer else 0.0
