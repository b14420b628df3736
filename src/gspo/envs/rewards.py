"""Reward functions: map (completion text, example) to a float.

Every reward here is a plain function with the :data:`gspo.envs.tasks.base.RewardFn` signature.
They are pure (no state, no I/O) and cheap, so the trainer can call them once per sample. Use
:func:`score` to apply one to a batch: it turns any failure of the reward into a 0 reward and
counts it, so a buggy user reward cannot crash a training run.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import os
import re
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from gspo.envs.sandbox import code_reward, with_timeout

if TYPE_CHECKING:
    # Only for annotations: importing gspo.envs.tasks at runtime would be circular, since the
    # task modules import their rewards from here.
    from gspo.envs.tasks.base import Example, RewardFn

logger = logging.getLogger(__name__)

__all__ = [
    "FORMATS",
    "REWARDS",
    "code_reward",
    "combine",
    "countdown_reward",
    "exact_match",
    "extract_boxed",
    "extract_hashes",
    "extract_number",
    "format_reward",
    "get_reward",
    "math_verify_match",
    "numeric_match",
    "overlong_penalty",
    "reward_workers",
    "score",
    "score_each",
    "uses_sandbox",
]


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
        from math_verify.errors import TimeoutException
    except ImportError:  # pragma: no cover - older math-verify layouts
        return Exception
    return TimeoutException


def _parse_math(text: str, timeout: int | None) -> list[Any]:
    from math_verify import parse

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
        from math_verify import verify

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


def _has_boxed(text: str) -> bool:
    return extract_boxed(text) is not None


def _has_hashes_line(text: str) -> bool:
    # The answer after "####" must hold a digit: a bare "#####" or "#### MULT" line earned the
    # format bonus without an answer, and a policy learned to emit only that (reward hacking).
    return re.search(r"(?m)^[ \t]*####[ \t]*[^\s#][^\n]*", text) is not None and any(
        ch.isdigit() for ch in (extract_hashes(text) or "")
    )


FORMATS: dict[str, Callable[[str], bool]] = {
    "boxed_or_hashes": lambda text: _has_boxed(text) or _has_hashes_line(text),
    "boxed": _has_boxed,
    "hashes": _has_hashes_line,
}
"""Named answer formats for :func:`format_reward`: a non-empty ``\\boxed{...}``, a line
starting with ``#### <answer>`` whose answer holds a digit, or either."""


def format_reward(
    completion: str,
    example: Example | None = None,
    *,
    pattern: str | re.Pattern[str] = "boxed_or_hashes",
) -> float:
    """1.0 if the completion states its answer in the expected format, else 0.0.

    ``pattern`` is a name from :data:`FORMATS` (default: a ``\\boxed{...}`` or a ``####``
    line) or a compiled regular expression, which must match somewhere (``re.search``).
    ``example`` is unused; it is accepted so this has the reward signature. Select a format
    for a registry with ``functools.partial(format_reward, pattern="boxed")``.
    """
    if isinstance(pattern, re.Pattern):
        return 1.0 if pattern.search(completion) else 0.0
    try:
        check = FORMATS[pattern]
    except KeyError:
        raise ValueError(
            f"unknown format {pattern!r}; valid names: {', '.join(FORMATS)} "
            "(or pass a compiled re.Pattern)"
        ) from None
    return 1.0 if check(completion) else 0.0


def overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """DAPO soft overlong punishment for a completion of ``length`` tokens.

    0 up to ``max_length - cache_length``; then falls linearly to -1 across the last
    ``cache_length`` tokens; -1 at and beyond ``max_length``. E.g. with max 20480 and cache
    4096: 16384 -> 0.0, 18432 -> -0.5, 20480 -> -1.0, 20481 -> -1.0.
    """
    if max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"cache_length must be in (0, max_length={max_length}], got {cache_length}"
        )
    if length < 0:
        raise ValueError(f"length must be non-negative, got {length}")
    threshold = max_length - cache_length
    if length <= threshold:
        return 0.0
    if length > max_length:
        return -1.0
    return (threshold - length) / cache_length


def combine(*weighted: tuple[RewardFn, float]) -> RewardFn:
    """A reward that is the weighted sum of ``(reward_fn, weight)`` pairs.

    If any component raises, the combined reward raises too (so :func:`score` counts it as an
    error rather than silently scoring a partial sum).
    """
    if not weighted:
        raise ValueError("combine() needs at least one (reward_fn, weight) pair")
    for fn, weight in weighted:
        if not callable(fn):
            raise ValueError(f"not a reward function: {fn!r}")
        if not math.isfinite(weight):
            raise ValueError(f"weights must be finite, got {weight!r}")
    parts = tuple((fn, float(weight)) for fn, weight in weighted)

    def combined(completion: str, example: Example) -> float:
        return sum(weight * float(fn(completion, example)) for fn, weight in parts)

    combined.parts = parts  # type: ignore[attr-defined]  # read by uses_sandbox
    combined.__doc__ = "Weighted sum of " + ", ".join(
        f"{weight:g}*{getattr(fn, '__name__', repr(fn))}" for fn, weight in parts
    )
    return combined


def _as_reward(value: object) -> float | None:
    """``value`` as a finite float, or None if it is not a real finite number."""
    # numbers.Real covers int, float, bool, Fraction and numpy floats. Other objects with
    # __float__ (a 0-d tensor, numpy bools) are accepted too; str, None and complex are not.
    if isinstance(value, (str, bytes)) or not (
        isinstance(value, numbers.Real) or hasattr(value, "__float__")
    ):
        return None
    try:
        result = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return result if math.isfinite(result) else None


def score_each(
    reward_fn: RewardFn,
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    timeout_s: float | None = None,
    workers: int = 1,
) -> list[float | None]:
    """:func:`score`'s rewards one by one, None where the reward failed (raised, returned no
    finite number, or ran past ``timeout_s``)."""
    if len(completions) != len(examples):
        raise ValueError(
            f"{len(completions)} completions but {len(examples)} examples; they must pair up"
        )
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if timeout_s is not None:
        reward_fn = with_timeout(reward_fn, timeout_s)

    def one(pair: tuple[str, Example]) -> float | None:
        try:
            return _as_reward(reward_fn(*pair))
        # SystemExit too: a user reward calling sys.exit() must not end the training run.
        except (Exception, SystemExit):
            logger.debug("reward %r raised", reward_fn, exc_info=True)
            return None

    pairs = list(zip(completions, examples, strict=True))
    if workers > 1 and len(pairs) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(workers, len(pairs)), thread_name_prefix="reward") as pool:
            return list(pool.map(one, pairs))
    return [one(pair) for pair in pairs]


def score(
    reward_fn: RewardFn,
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    timeout_s: float | None = None,
    workers: int = 1,
) -> tuple[list[float], int]:
    """Apply ``reward_fn`` to each (completion, example) pair; return (rewards, n_errors).

    A call that raises, or returns something other than a real finite number (None, a string,
    NaN, inf; bools count as 0/1), gives that sample 0.0 and adds one to ``n_errors``; other
    samples keep their reward. Failures of the reward never propagate (KeyboardInterrupt does).
    With ``timeout_s``, a call still running after that many seconds also scores 0.0 and
    counts as an error (:func:`gspo.envs.sandbox.with_timeout`, thread mode: the late call is left
    running in the background; wrap the reward with ``mode="process"`` yourself to have it
    killed). Without it a hanging reward blocks the caller.

    ``workers`` > 1 scores that many calls at once in threads (same results, same order):
    worth it for rewards that wait on a process, such as the code sandbox
    (:func:`reward_workers` picks a count), not for pure-Python ones (the GIL).
    """
    values = score_each(reward_fn, completions, examples, timeout_s=timeout_s, workers=workers)
    n_errors = sum(value is None for value in values)
    return [0.0 if value is None else value for value in values], n_errors


MAX_AUTO_REWARD_WORKERS = 8
"""Upper bound of :func:`reward_workers`' automatic choice (each worker may hold a sandboxed
run with its own memory bound, ``SandboxConfig.run_memory_mb``)."""


def uses_sandbox(reward_fn: RewardFn) -> bool:
    """Whether ``reward_fn`` runs programs in the code sandbox: :func:`code_reward`, a
    ``functools.partial`` of it, a :func:`combine` or thread-mode timeout containing it."""
    stack: list[Any] = [reward_fn]
    for _ in range(100):  # bounded: a wrapper pointing at itself must not loop
        if not stack:
            return False
        fn = stack.pop()
        if getattr(fn, "uses_sandbox", False) is True:
            return True
        if isinstance(fn, functools.partial):
            stack.append(fn.func)
        stack.extend(part for part, _ in getattr(fn, "parts", ()))
        if callable(getattr(fn, "fn", None)):
            stack.append(fn.fn)
    return False


def reward_workers(reward_fn: RewardFn, requested: int = 0) -> int:
    """How many reward calls :func:`score` runs at once: ``requested`` if positive; else one
    per CPU core (at most :data:`MAX_AUTO_REWARD_WORKERS`) for sandboxed rewards, 1 for the
    rest (pure-Python rewards gain nothing from threads and math-verify's own timeout needs
    the main thread)."""
    if requested > 0:
        return requested
    if uses_sandbox(reward_fn):
        return max(1, min(MAX_AUTO_REWARD_WORKERS, os.cpu_count() or 1))
    return 1


from gspo.envs.countdown import countdown_reward  # noqa: E402  (re-exported)

REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "numeric": numeric_match,
    "math_verify": math_verify_match,
    "format": format_reward,
    "countdown": countdown_reward,
    "code": code_reward,
}
"""Rewards selectable by name (e.g. for tasks built from user data files)."""


def get_reward(name: str) -> RewardFn:
    """The reward registered under ``name``; ValueError listing the valid names otherwise."""
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid names: {', '.join(REWARDS)}") from None
