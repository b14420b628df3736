"""Judging a sandboxed program's answers: exact rules by type and mode, and a parser that
never raises.

A comparison runs in one of three modes (:data:`COMPARE_MODES`; a row picks one with its
``compare`` field, a task with ``code_reward(compare=...)``, a run with ``code_compare``):

* ``auto`` (the default): the expected value's type decides. A **string** (every stdout text,
  a functional test's JSON string) compares **as text**: exactly, except that stdout is split
  into whitespace-separated tokens first (spacing and trailing newlines do not matter). A
  **number** (a JSON number in ``outputs`` or a functional test's output) compares **as a
  number** (below). Booleans and None by identity, lists and objects element by element.
* ``text``: everything as text. Stdout tokens must be identical; JSON values must be equal
  and of the same type (``3.0`` is not ``3``, floats without tolerance).
* ``number``: also strings that are written as numbers compare as numbers.

As a number, only ASCII forms count (:data:`_NUMBER_RE`: sign, digits, point, exponent; no
``inf``/``nan``, no fullwidth or Arabic-Indic digits, no ``_`` or ``,`` separators):

* **integers** (an expected value without point or exponent) compare exactly, at any size:
  ``1000000999999`` is not ``10**12``. A number equal in value is accepted (``3.0``, ``3e0``,
  ``003`` and ``+3`` for ``3``; ``-0`` for ``0``, as LiveCodeBench's Decimal comparison does);
  ``3.0000001`` is not.
* **floats** (an expected value written with a point or an exponent) match within
  :data:`FLOAT_TOLERANCE`, absolute or relative: ``abs(a - e) <= 1e-6 * max(1, abs(e))``
  (so ``0`` passes for ``1e-9``). Non-finite values must be identical.

Everything here is a pure function of its inputs and never raises on hostile data: deep
nesting, huge numbers and malformed records become a failed test with a reason.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from gspo.config.names import COMPARE_MODES

FLOAT_TOLERANCE = 1e-6
"""Absolute or relative tolerance for expected values that are floats (compared as numbers)."""

# re.ASCII: \d would also match fullwidth and Arabic-Indic digits, which Decimal accepts.
_INT_RE = re.compile(r"[+-]?\d+\Z", re.ASCII)
_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z", re.ASCII)
_MAX_RECORD_PROBLEMS = 3
_DECIMAL_TOLERANCE = Decimal(str(FLOAT_TOLERANCE))


def check_mode(mode: object) -> str:
    """``mode`` if it is one of :data:`COMPARE_MODES`; ValueError naming the valid ones."""
    if mode not in COMPARE_MODES:
        raise ValueError(f"compare mode must be one of {', '.join(COMPARE_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


def _decimal(token: str) -> Decimal | None:
    if not _NUMBER_RE.match(token):
        return None
    try:
        return Decimal(token)
    except ArithmeticError:  # an exponent beyond Decimal's range
        return None


def _close(a: float, e: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(e)):
        return a == e
    return abs(a - e) <= FLOAT_TOLERANCE * max(1.0, abs(e))


def tokens_match(actual: str, expected: str, mode: str = "number") -> bool:
    """One stdout token against the expected one: identical, or (``mode="number"``) both
    numbers equal under the rules of the module doc."""
    if actual == expected:
        return True
    if mode != "number":
        return False
    e = _decimal(expected)
    a = _decimal(actual)
    if e is None or a is None:
        return False  # strings: only identical ones match
    if _INT_RE.match(expected):
        return a == e  # exact, any size
    try:
        fa, fe = float(a), float(e)
    except (OverflowError, ValueError):
        return a == e
    if math.isfinite(fa) and math.isfinite(fe):
        return _close(fa, fe)
    # Beyond float range float() gives inf, and inf == inf would let 5e999 pass for 1e400:
    # the same rule in Decimal arithmetic (exact if even that overflows).
    try:
        return abs(a - e) <= _DECIMAL_TOLERANCE * max(Decimal(1), abs(e))
    except ArithmeticError:
        return a == e


def outputs_match(actual: str, expected: str | int | float, mode: str = "auto") -> bool:
    """Whether a program's stdout answers a stdin/stdout test, token by token.

    ``expected`` is the test's output as the data gave it: a string compares as text unless
    ``mode="number"``; a number (not a bool) compares as a number unless ``mode="text"``.
    """
    if isinstance(expected, bool):
        expected = str(expected)
    if isinstance(expected, (int, float)):
        if mode == "auto":
            mode = "number"
        expected = repr(expected) if isinstance(expected, float) else str(expected)
    elif mode == "auto":
        mode = "text"
    a, e = actual.split(), expected.split()
    return len(a) == len(e) and all(tokens_match(x, y, mode) for x, y in zip(a, e, strict=True))


def values_match(actual: Any, expected: Any, mode: str = "auto") -> bool:
    """Equality of JSON values by type and ``mode`` (see the module doc); False rather than
    raising."""
    try:
        if mode == "text":
            return _same(actual, expected)
        return _values_match(actual, expected, mode == "number")
    except (RecursionError, OverflowError, ValueError, TypeError):
        return False


def _same(actual: Any, expected: Any) -> bool:
    """Text mode: equal and of the same JSON type (an integer too long for int is a Decimal)."""
    integers = (int, Decimal)
    if isinstance(expected, bool) or isinstance(actual, bool) or expected is None:
        return actual is expected
    if isinstance(expected, integers):
        return isinstance(actual, integers) and Decimal(actual) == Decimal(expected)
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_same(a, e) for a, e in zip(actual, expected, strict=True))
        )
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(_same(actual[k], expected[k]) for k in expected)
        )
    return type(actual) is type(expected) and actual == expected


def _values_match(actual: Any, expected: Any, numbers_in_text: bool = False) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool) or expected is None:
        return actual is expected
    if numbers_in_text and isinstance(expected, str) and _NUMBER_RE.match(expected):
        # number mode: "2.50" expected, 2.5 or "2.5" returned
        if isinstance(actual, (int, float, Decimal)):
            actual = repr(actual) if isinstance(actual, float) else str(actual)
        return isinstance(actual, str) and tokens_match(actual, expected, "number")
    if isinstance(expected, Decimal) or isinstance(actual, Decimal):  # integers too long for int
        numbers = (int, float, Decimal)
        return (
            isinstance(expected, numbers)
            and isinstance(actual, numbers)
            and not isinstance(expected, float)
            and (not isinstance(actual, float) or math.isfinite(actual))
            and Decimal(actual) == Decimal(expected)
        )
    if isinstance(expected, int):
        if isinstance(actual, int):
            return actual == expected
        return isinstance(actual, float) and math.isfinite(actual) and actual == expected
    if isinstance(expected, float):
        if isinstance(actual, int):
            actual = float(actual)  # OverflowError for a huge int: no match
        return isinstance(actual, float) and _close(actual, expected)
    if isinstance(expected, str):
        return isinstance(actual, str) and actual == expected
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(
                _values_match(a, e, numbers_in_text) for a, e in zip(actual, expected, strict=True)
            )
        )
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(_values_match(actual[k], expected[k], numbers_in_text) for k in expected)
        )
    return False


_INT_DIGITS = 4000  # below Python's int('...') limit (4300): longer literals stay Decimal


def _parse_int(text: str) -> int | Decimal:
    # int('...') of a long literal raises (Python's digit limit), and converting a Decimal to
    # int is quadratic (a million digits: about a minute). A Decimal is exact and linear.
    return int(text) if len(text) <= _INT_DIGITS else Decimal(text)


def loads(text: str) -> Any:
    """``json.loads`` reading integers of any length (longer ones as exact Decimals), in time
    linear in their length. May raise (deep nesting, bad JSON); :func:`parse_results` catches."""
    return json.loads(text, parse_int=_parse_int)


def short_repr(value: Any, limit: int = 200) -> str:
    """A bounded description of a value, for error messages; never raises."""
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        text = f"<{type(value).__name__} that cannot be shown>"
    return text if len(text) <= limit else text[:limit] + "..."


def parse_results(raw: bytes, nonce: str, n: int) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The harness's records for tests 0..n-1 from the result channel, and what was wrong.

    Records are JSON lines carrying the run's ``nonce``; the first per test wins. Lines that
    do not parse (deep nesting, numbers too long, bad JSON) or do not have the record's shape
    are skipped and described; this never raises.
    """
    records: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), start=1):
        try:
            record = loads(line)
        except (ValueError, RecursionError, MemoryError, ArithmeticError) as exc:
            if len(problems) < _MAX_RECORD_PROBLEMS:
                problems.append(f"result line {number}: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        if not (isinstance(record, dict) and record.get("nonce") == nonce):
            continue  # not the harness's (text the program wrote there): ignored
        i = record.get("i")
        if not (type(i) is int and 0 <= i < n) or not isinstance(record.get("ok"), bool):
            if len(problems) < _MAX_RECORD_PROBLEMS:
                problems.append(f"result line {number}: not a test record")
            continue
        records.setdefault(i, record)
    return records, problems
