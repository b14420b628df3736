"""The countdown reward: the completion's arithmetic expression over the problem's numbers must
reach the target (each number used at most once), parsed with ``ast``, never ``eval``."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gspo.envs.tasks.base import Example


_COUNTDOWN_CHARS = re.compile(r"[0-9+\-*/() ]+")
# Longer than any sensible expression over a handful of small numbers; bounds parser work and
# keeps ast recursion shallow for adversarial inputs like "((((((...".
_COUNTDOWN_MAX_CHARS = 200
_COUNTDOWN_OPS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _eval_countdown(node: ast.AST, used: list[int]) -> Fraction:
    """Evaluate a whitelisted expression tree exactly, recording the literals it uses."""
    if isinstance(node, ast.BinOp) and type(node.op) in _COUNTDOWN_OPS:
        left = _eval_countdown(node.left, used)
        right = _eval_countdown(node.right, used)
        return _COUNTDOWN_OPS[type(node.op)](left, right)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    # Unary minus, powers, floor division, names, calls...: not part of the game.
    raise ValueError(f"disallowed syntax: {type(node).__name__}")


def _countdown_numbers(example: Example) -> list[int]:
    numbers_ = example.meta.get("numbers")
    if numbers_ is None:
        raise KeyError("countdown_reward needs example.meta['numbers']")
    if isinstance(numbers_, str):  # e.g. "3,5,7" from a user data file
        return [int(part) for part in numbers_.split(",")]
    return [int(n) for n in numbers_]


def countdown_reward(completion: str, example: Example) -> float:
    """1.0 if the completion is an expression hitting the target, using each number at most once.

    The completion (surrounding whitespace ignored) may contain only digits, ``+ - * /``,
    parentheses and spaces. It is parsed with :mod:`ast` and evaluated exactly with Fractions
    (never ``eval``); division by zero, unary operators, reusing a number more often than it
    is given, or a wrong value all score 0.0. Numbers come from ``example.meta["numbers"]``
    and the target from ``example.meta["target"]`` (falling back to ``example.answer``).
    """
    numbers_ = _countdown_numbers(example)
    target = Fraction(str(example.meta.get("target", example.answer)).strip())
    text = completion.strip()
    if not text or len(text) > _COUNTDOWN_MAX_CHARS or not _COUNTDOWN_CHARS.fullmatch(text):
        return 0.0
    try:
        tree = ast.parse(text, mode="eval")
        used: list[int] = []
        value = _eval_countdown(tree.body, used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return 0.0
    if Counter(used) - Counter(numbers_):  # some number used more often than given
        return 0.0
    return 1.0 if value == target else 0.0


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------
