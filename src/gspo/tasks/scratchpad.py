"""A task where response length matters: summing digits, with or without a scratchpad.

Prompt ``"5+8+2+9+3="``, answer ``"27"``. A completion may answer directly (``"27"``, the *short*
form) or write the running sums first (``"5+8=13+2=15+9=24+3=27"``, the *long* form: each step
copies the next digit from the prompt and adds it to the two-digit sum so far). The reward checks only
the final answer, the text after the last ``=`` of the completion (the whole completion when it
has no ``=``), so both forms earn the same reward when right.

For a tiny character-level model the short form is hard (it must add all digits in one token
step), the long form easy (one single-digit addition per step), so the share of long answers
and the mean response length are what an RL algorithm's length dynamics move. The
demonstrations for the supervised cold start mix both forms (:data:`LONG_FRACTION` long), so
RL starts from a policy that writes both.

Difficulty = number of digits (3..7; the long form has 5 x digits - 4 characters: 31 for 7
digits, within a 32-token budget). Problems are split by their multiset of digits, so a test problem is never a
reordering of a training problem. The task is registered as ``"scratchpad"`` in
:data:`gspo.tasks.synthetic.TASKS`, which draws the splits (stable-hash disjoint, seeded).
"""

from __future__ import annotations

import random

from gspo.tasks.base import Example

__all__ = [
    "DEFAULT_DIGITS",
    "LONG_FRACTION",
    "MAX_DIGITS",
    "MIN_DIGITS",
    "final_answer",
    "long_form",
    "sample_scratchpad",
    "scratchpad_key",
    "scratchpad_reward",
    "scratchpad_space",
]

MIN_DIGITS = 3
DEFAULT_DIGITS = 5
MAX_DIGITS = 7
LONG_FRACTION = 0.5
"""Share of cold-start demonstrations written in the long (scratchpad) form."""

DESCRIPTION = (
    "Sum digits: '5+8+2+9+3=' -> '27', directly or with running sums "
    "'5+8=13+2=15+9=24+3=27' (only the text after the last '=' is scored; cold-start demos mix "
    "both forms). Difficulty = number of digits."
)


def long_form(digits: list[int]) -> str:
    """The scratchpad completion ``"a+b=s1+c=s2..."``, ending with the total.

    Running sums are written with two digits (``"0+5=05+1=06"``), so every character of the
    scratchpad sits at a fixed position for a given number of digits.
    """
    if len(digits) < 2:
        raise ValueError(f"need at least 2 digits, got {digits!r}")
    total = digits[0] + digits[1]
    parts = [f"{digits[0]}+{digits[1]}={total:02d}"]
    for d in digits[2:]:
        total += d
        parts.append(f"+{d}={total:02d}")
    return "".join(parts)


def sample_scratchpad(
    rng: random.Random, count: int, long_fraction: float = LONG_FRACTION
) -> Example:
    """Draw one problem of ``count`` digits; its demo is long with probability ``long_fraction``."""
    digits = [rng.randint(0, 9) for _ in range(count)]
    answer = str(sum(digits))
    form = "long" if rng.random() < long_fraction else "short"
    demo = long_form(digits) if form == "long" else answer
    meta = {"difficulty": count, "digits": digits, "form": form}
    return Example(prompt="+".join(map(str, digits)) + "=", answer=answer, demo=demo, meta=meta)


def scratchpad_key(example: Example) -> str:
    """The split key: the sorted digits (reorderings of one problem stay in one split)."""
    return "sum:" + "".join(sorted(str(d) for d in example.meta["digits"]))


def scratchpad_space(count: int) -> int:
    """Every prompt of ``count`` digits has probability 10^-count."""
    return 10**count


def final_answer(completion: str) -> str:
    """The text after the last ``=`` (the whole completion when there is none), stripped."""
    return completion.rsplit("=", 1)[-1].strip()


def scratchpad_reward(completion: str, example: Example) -> float:
    """1.0 when the final answer is the reference sum, else 0.0; the scratchpad is not checked.

    The final answer must be digits only and is compared as a number, so the long form's
    zero-padded ``"06"`` and the short form's ``"6"`` both count.
    """
    answer = final_answer(completion)
    return (
        1.0 if answer.isdigit() and answer.isascii() and int(answer) == int(example.answer) else 0.0
    )
