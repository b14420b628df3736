"""Judging a sandboxed program's answers: exact rules by type, and a parser that never raises.

Comparison rules (stdout tokens and functional return values alike):

* **integers** compare exactly, at any size: ``1000000999999`` is not ``10**12``. A numeric
  token or float equal in value is accepted (``"3.0"`` for ``3``, as LiveCodeBench's Decimal
  comparison does); ``"3.0000001"`` is not.
* **floats** (an expected value written with a point or an exponent) match within
  :data:`FLOAT_TOLERANCE`, absolute or relative: ``abs(a - e) <= 1e-6 * max(1, abs(e))``.
  Non-finite values must be identical.
* **strings** compare exactly (stdout is split into whitespace-separated tokens first, so
  spacing and trailing newlines do not matter); **booleans** and **None** by identity; lists
  and objects element by element with the same rules.

Everything here is a pure function of its inputs and never raises on hostile data: deep
nesting, huge numbers and malformed records become a failed test with a reason.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

FLOAT_TOLERANCE = 1e-6
"""Absolute or relative tolerance for expected values that are floats."""

_INT_RE = re.compile(r"[+-]?\d+\Z")
_DECIMAL_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")
_MAX_RECORD_PROBLEMS = 3


def _decimal(token: str) -> Decimal | None:
    if not _DECIMAL_RE.match(token):
        return None
    try:
        return Decimal(token)
    except ArithmeticError:  # an exponent beyond Decimal's range
        return None


def _close(a: float, e: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(e)):
        return a == e
    return abs(a - e) <= FLOAT_TOLERANCE * max(1.0, abs(e))


def tokens_match(actual: str, expected: str) -> bool:
    """One stdout token against the expected one (see the module doc)."""
    if actual == expected:
        return True
    e = _decimal(expected)
    a = _decimal(actual)
    if e is None or a is None:
        return False  # strings: only identical ones match
    if _INT_RE.match(expected):
        return a == e  # exact, any size
    try:
        return _close(float(a), float(e))
    except (OverflowError, ValueError):
        return a == e


def outputs_match(actual: str, expected: str) -> bool:
    """Whether a program's stdout answers a stdin/stdout test, token by token."""
    a, e = actual.split(), expected.split()
    return len(a) == len(e) and all(tokens_match(x, y) for x, y in zip(a, e, strict=True))


def values_match(actual: Any, expected: Any) -> bool:
    """Equality of JSON values by type (see the module doc); False rather than raising."""
    try:
        return _values_match(actual, expected)
    except (RecursionError, OverflowError, ValueError, TypeError):
        return False


def _values_match(actual: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool) or expected is None:
        return actual is expected
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
            and all(_values_match(a, e) for a, e in zip(actual, expected, strict=True))
        )
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(_values_match(actual[k], expected[k]) for k in expected)
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
