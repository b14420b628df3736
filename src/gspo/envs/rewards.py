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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gspo.config.names import BUILTIN_REWARDS, declared
from gspo.config.plugins import is_ref, resolve
from gspo.sandbox import code_reward, with_timeout

from .answers import (  # re-exported: answer matchers are rewards too
    exact_match,
    extract_boxed,
    extract_hashes,
    extract_number,
    math_verify_match,
    numeric_match,
)

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
    counts as an error (:func:`gspo.sandbox.with_timeout`, thread mode: the late call is left
    running in the background; wrap the reward with ``mode="process"`` yourself to have it
    killed). Without it a hanging reward blocks the caller.

    ``workers`` > 1 scores that many calls at once in threads (same results, same order):
    worth it for rewards that wait on a process, such as the code sandbox
    (:func:`reward_workers` picks a count), not for pure-Python ones (the GIL).
    """
    return zero_failed(
        score_each(reward_fn, completions, examples, timeout_s=timeout_s, workers=workers)
    )


def zero_failed(values: Sequence[float | None]) -> tuple[list[float], int]:
    """:func:`score_each`'s rewards as :func:`score` returns them: (0.0 for each failed one,
    the number failed)."""
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

REWARDS: dict[str, RewardFn] = declared(
    BUILTIN_REWARDS,
    {
        "exact_match": exact_match,
        "numeric": numeric_match,
        "math_verify": math_verify_match,
        "format": format_reward,
        "countdown": countdown_reward,
        "code": code_reward,
    },
    "rewards",
)
"""Rewards selectable by name (e.g. for tasks built from user data files); the built-ins are
those ``gspo.config.names.BUILTIN_REWARDS`` declares."""


def register_reward(name: str):
    """Register ``fn(completion, example) -> float`` under ``name``, for ``--reward NAME``;
    a decorator."""

    def decorator(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return decorator


def get_reward(name: str) -> RewardFn:
    """The reward registered under ``name``, or the function ``module:function`` names
    (imported now); ValueError listing the valid names otherwise."""
    if is_ref(name):
        return resolve("reward", name)
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid names: {', '.join(REWARDS)}") from None
