"""Answer matchers: the number, ``\\boxed{}`` or ``####`` answer a completion states, and the
rewards that compare it with the reference (exact, numeric, math-verify equivalence).

Pure functions with the :data:`gspo.envs.tasks.base.RewardFn` signature; :mod:`gspo.envs.rewards`
re-exports them beside the scoring helpers.
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gspo.envs.tasks.base import Example

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Answer extraction
# --------------------------------------------------------------------------------------------

# A number: optional minus sign (only when it is not a binary minus, i.e. not right after a
# digit or a closing parenthesis, so "10-3" yields 3 rather than -3), then either a
# thousands-grouped integer ("1,234,567"; the lookahead stops "1,2345" from matching as
# "1,234" but lets "1,234, so" end there), a plain integer, or a bare fraction part (".5"), then an optional decimal part.
_NUMBER_RE = re.compile(
    r"(?:(?<![\d)])-)?(?:\d{1,3}(?:,\d{3})+(?!,?\d)|\d+|(?=\.\d))(?:\.\d+)?",
)
_HASHES_RE = re.compile(r"####[ \t]*([^\n]*)")


def extract_hashes(text: str) -> str | None:
    """Return the stripped text after the last ``####`` (GSM8K style) up to the line end.

    Returns None when there is no ``####`` or nothing follows it.
    """
    matches = _HASHES_RE.findall(text)
    if not matches:
        return None
    answer = matches[-1].strip()
    return answer or None


def _boxed_spans(text: str) -> list[tuple[int, str]]:
    """All ``\\boxed{...}`` contents with balanced braces, with their start offsets."""
    spans = []
    start = text.find("\\boxed{")
    while start != -1:
        i = start + len("\\boxed{")
        depth = 1
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            spans.append((start, text[start + len("\\boxed{") : i - 1]))
        start = text.find("\\boxed{", start + 1)
    return spans


def extract_boxed(text: str) -> str | None:
    """Return the stripped content of the last ``\\boxed{...}`` (nested braces allowed).

    Returns None when there is no complete, non-empty box.
    """
    spans = _boxed_spans(text)
    if not spans:
        return None
    content = spans[-1][1].strip()
    return content or None


def _final_answer(text: str) -> str | None:
    """The answer the completion commits to: whichever of \\boxed{} / #### comes last."""
    candidates: list[tuple[int, str]] = []
    spans = _boxed_spans(text)
    if spans and spans[-1][1].strip():
        candidates.append((spans[-1][0], spans[-1][1].strip()))
    hashes = extract_hashes(text)
    if hashes is not None:
        candidates.append((text.rfind("####"), hashes))
    if not candidates:
        return None
    return max(candidates)[1]


def extract_number(text: str) -> Fraction | None:
    """Return the last number in ``text`` as an exact Fraction, or None if there is none.

    If the text has a ``####`` marker, only what follows the last one is searched (GSM8K
    convention: the reasoning before it is full of intermediate numbers). Accepts integers,
    decimals, negatives and thousands separators ("1,234").
    """
    hashes = extract_hashes(text)
    if hashes is not None:
        text = hashes
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    try:
        # Fraction parses decimal strings exactly, so "0.1" compares without float rounding.
        return Fraction(matches[-1].replace(",", ""))
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return None


# --------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------


_NUMERIC_REL_TOL = Fraction(1, 10**6)


def exact_match(completion: str, example: Example) -> float:
    """1.0 if the completion equals the reference answer up to surrounding whitespace."""
    return 1.0 if completion.strip() == example.answer.strip() else 0.0


def numeric_match(completion: str, example: Example) -> float:
    """1.0 if the last number of the completion equals the answer's number (rel. tol. 1e-6).

    Both sides go through :func:`extract_number`, so the answer may itself be "1,234" or a
    GSM8K solution ending in "#### 72". No number in either -> 0.0.
    """
    predicted = extract_number(completion)
    reference = extract_number(example.answer)
    if predicted is None or reference is None:
        return 0.0
    # math.isclose's rule, in exact arithmetic so that huge numbers cannot overflow a float.
    tolerance = _NUMERIC_REL_TOL * max(abs(predicted), abs(reference))
    return 1.0 if abs(predicted - reference) <= tolerance else 0.0


# Signal-based timeouts (what math-verify uses on POSIX) only work in the main thread; a reward
# called from a worker thread must run without them or math-verify raises ValueError.
_MATH_VERIFY_TIMEOUT_S = 5


def _math_verify_timeout() -> int | None:
    return _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _timeout_exception() -> type[BaseException]:
    try:
        from math_verify.errors import TimeoutException  # on use: math_verify loads sympy (~1 s)
    except ImportError:  # pragma: no cover - older math-verify layouts
        return Exception
    return TimeoutException


def _parse_math(text: str, timeout: int | None) -> list[Any]:
    from math_verify import parse  # on use: it loads sympy, about a second

    if "$" in text or "\\boxed" in text:
        return parse(text, parsing_timeout=timeout)  # type: ignore[arg-type]
    # Undelimited text is read as one LaTeX expression: parse() alone would pick "1" out of
    # "1+x^2" and miss bare LaTeX such as "\dfrac12". Plain parsing is the fallback.
    parsed = parse(f"${text}$", parsing_timeout=timeout)  # type: ignore[arg-type]
    return parsed or parse(text, parsing_timeout=timeout)  # type: ignore[arg-type]


def math_verify_match(completion: str, example: Example) -> float:
    """1.0 if the completion's final answer is mathematically equivalent to the reference.

    The final answer is the content of the last ``\\boxed{...}`` or the text after the last
    ``####``, whichever comes later; without either the reward is 0.0. Equivalence is decided
    by math-verify (so 1/2, 0.5 and \\frac{1}{2} all match). Works from any thread (timeouts are
    only used in the main thread, where math-verify's SIGALRM mechanism is available) and never
    raises: any parse or verify failure, including a math-verify timeout, scores 0.0.
    """
    answer = _final_answer(completion)
    if answer is None:
        return 0.0
    timeout = _math_verify_timeout()
    try:
        from math_verify import verify  # on use, as parse

        # A GSM8K-style reference solution ("... #### 72") is reduced to its final answer.
        gold = _parse_math(extract_hashes(example.answer) or example.answer, timeout)
        predicted = _parse_math(f"\\boxed{{{answer}}}", timeout)
        if not gold or not predicted:
            return 0.0
        return 1.0 if verify(gold, predicted, timeout_seconds=timeout) else 0.0
    # math-verify's TimeoutException derives from BaseException, so Exception alone misses it.
    except (Exception, _timeout_exception()):
        logger.debug("math_verify_match failed", exc_info=True)
        return 0.0
