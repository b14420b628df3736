"""GSM8K-like arithmetic word problems for pretrained chat models, generated from templates.

A problem is a short story with a running quantity (items someone has, or dollars) changed by
``difficulty`` operations, one per sentence (add, subtract, double/triple, halve/third), then a
question::

    Mia has 12 apples. She buys 7 more. Then she gives 5 to Omar. How many apples does Mia have
    now?
    Solve it, then write the final answer after ####.

The answer is an integer (every intermediate value is a positive integer up to 999), the
reference demo shows the arithmetic one line per step and ends in ``#### 14``, and the reward
is :func:`gspo.envs.rewards.math_verify_match`: the final answer after the last ``####`` or in the
last ``\\boxed{}`` (whichever comes later), checked by math-verify. The instruction asks for
GSM8K's ``####`` because small chat models trained on GSM8K-style data follow it far more
often than ``\\boxed{}`` (SmolLM2-135M-Instruct: about half vs a few percent of greedy
answers). Difficulty = number of operations, 1..4; numbers grow with it.

Splits are disjoint by the problem's *arithmetic* (start value and the operations), not its
wording: a test problem never appears in training under other names or objects. Prompts contain
newlines, so this task is for real tokenizers (the tiny character tokenizer cannot encode them).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from gspo.envs.rewards import math_verify_match
from gspo.envs.tasks.base import Example
from gspo.envs.tasks.synthetic import DIFFICULTIES, TASKS, _build, _Spec

__all__ = ["INSTRUCTION", "NAME", "sample_word_problem"]

NAME = "word_problems"
INSTRUCTION = "Solve it, then write the final answer after ####."
"""The line appended to every problem, telling the model the answer format the reward checks."""

MAX_VALUE = 999
"""Largest value the running quantity may take at any difficulty."""

_RANGES: dict[int, tuple[int, int, int, int]] = {
    1: (2, 40, 20, 80),
    2: (5, 20, 15, 100),
    3: (5, 40, 30, 200),
    4: (5, 40, 30, 200),
}
"""Per difficulty: (lowest start, highest start, largest +/- operand, largest value after a
x2 / x3)."""

# (name, subject pronoun, possessive / object pronoun)
_PEOPLE = [
    ("Mia", "she", "her"),
    ("Liam", "he", "his"),
    ("Ava", "she", "her"),
    ("Noah", "he", "his"),
    ("Emma", "she", "her"),
    ("Omar", "he", "his"),
    ("Sofia", "she", "her"),
    ("Ken", "he", "his"),
    ("Lena", "she", "her"),
    ("Ravi", "he", "his"),
    ("Zoe", "she", "her"),
    ("Ivan", "he", "his"),
]
_ITEMS = ["apples", "marbles", "stickers", "books", "cookies", "pencils", "shells", "cards"]
_THINGS = ["book", "toy", "hat", "game", "lamp", "kite"]


@dataclass(frozen=True)
class _Step:
    op: str  # "+", "-", "*", "/"
    n: int
    sentence: str


def _object(possessive: str) -> str:
    return "him" if possessive == "his" else "her"


def _item_sentence(
    op: str, n: int, who: tuple[str, str, str], friend: str, items: str
) -> list[str]:
    _, p, pos = who
    P = p.capitalize()
    if op == "+":
        return [
            f"{P} buys {n} more.",
            f"{P} finds {n} more {items}.",
            f"{friend} gives {_object(pos)} {n} {items}.",
        ]
    if op == "-":
        return [f"Then {p} gives {n} to {friend}.", f"{P} loses {n} of them.", f"{P} sells {n}."]
    if op == "*":
        word = {2: "doubles", 3: "triples"}[n]
        return [f"Then the number of {items} {p} has {word}."]
    word = {2: "half", 3: "a third"}[n]
    return [f"{P} keeps only {word} of them and gives the rest away."]


def _money_sentence(
    op: str, n: int, who: tuple[str, str, str], friend: str, thing: str
) -> list[str]:
    _, p, pos = who
    P = p.capitalize()
    if op == "+":
        return [f"{P} earns {n} dollars.", f"{friend} gives {_object(pos)} {n} dollars."]
    if op == "-":
        return [
            f"{P} spends {n} dollars on a {thing}.",
            f"Then {p} pays {n} dollars for a {thing}.",
        ]
    if op == "*":
        word = {2: "doubles", 3: "triples"}[n]
        return [f"Then {pos} money {word}."]
    word = {2: "half", 3: "a third"}[n]
    return [f"{P} spends all but {word} of {pos} money on a {thing}."]


def _apply(op: str, x: int, n: int) -> int:
    return {"+": x + n, "-": x - n, "*": x * n, "/": x // n}[op]


def _choose_op(rng: random.Random, x: int, operand: int, product: int) -> tuple[str, int]:
    """One operation that keeps the value a positive integer <= MAX_VALUE: +/- by at most
    ``operand``, x2 / x3 up to ``product``, or an exact /2 or /3."""
    options: list[tuple[str, int]] = []
    if x + 2 <= MAX_VALUE:
        options += [("+", rng.randint(2, min(operand, MAX_VALUE - x)))] * 3
    if x >= 3:
        options += [("-", rng.randint(1, min(operand, x - 1)))] * 3
    for k in (2, 3):
        if x * k <= product:
            options.append(("*", k))
        if x % k == 0 and x // k >= 1:
            options.append(("/", k))
    return rng.choice(options)


def sample_word_problem(rng: random.Random, steps: int) -> Example:
    """One problem with ``steps`` operations, drawn from ``rng``."""
    who = rng.choice(_PEOPLE)
    friend = rng.choice([p[0] for p in _PEOPLE if p[0] != who[0]])
    money = rng.random() < 0.3
    items, thing = rng.choice(_ITEMS), rng.choice(_THINGS)
    low, high, operand, product = _RANGES[steps]
    start = rng.randint(low, high)
    x = start
    sentences = [f"{who[0]} has {start} {'dollars' if money else items}."]
    lines: list[str] = []
    ops: list[tuple[str, int]] = []
    for _ in range(steps):
        op, n = _choose_op(rng, x, operand, product)
        options = (
            _money_sentence(op, n, who, friend, thing)
            if money
            else _item_sentence(op, n, who, friend, items)
        )
        sentences.append(rng.choice(options))
        y = _apply(op, x, n)
        lines.append(f"{x} {'x' if op == '*' else op} {n} = {y}")
        ops.append((op, n))
        x = y
    unit = "dollars" if money else items
    question = f"How many {unit} does {who[0]} have now?"
    prompt = f"{' '.join(sentences)} {question}\n{INSTRUCTION}"
    demo = "\n".join([*lines, f"#### {x}"])
    arithmetic = f"{start}" + "".join(f"{op}{n}" for op, n in ops)
    meta = {"difficulty": steps, "arithmetic": arithmetic, "steps": lines}
    return Example(prompt=prompt, answer=str(x), demo=demo, meta=meta)


def _space(steps: int) -> int:
    # starts x (operations x numbers)^steps x wordings (people, friends, objects, sentences).
    low, high, operand, _ = _RANGES[steps]
    return (high - low + 1) * (2 * operand + 4) ** steps * 12 * 11 * 8 * 3**steps


SPEC = _Spec(
    name=NAME,
    description=(
        "GSM8K-like word problems: a quantity changed by +, -, x2/x3, /2 /3, one operation per "
        "sentence, answer after #### (or in \\boxed{}). Difficulty = number of operations (1..4)."
    ),
    default=2,
    low=1,
    high=4,
    sample=sample_word_problem,
    space=_space,
    reward=math_verify_match,
    key=lambda example: example.meta["arithmetic"],
)

TASKS[NAME] = functools.partial(_build, SPEC)
DIFFICULTIES[NAME] = (SPEC.low, SPEC.default, SPEC.high)
