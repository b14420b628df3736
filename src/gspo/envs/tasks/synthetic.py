"""Built-in synthetic tasks for tiny character-level models.

Prompts, answers and demos are short printable-ASCII strings without chat formatting, e.g.
``"37+45="`` -> ``"82"``. Every task is deterministic given its seed and difficulty, and its
train and test splits are disjoint: each distinct problem is assigned to one split by a stable
hash of its key (roughly 10% of the problem space is test-only), and samples are drawn for a
split by rejection from a seeded :class:`random.Random`.
"""

from __future__ import annotations

import functools
import hashlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gspo.envs.tasks.shapes as _shapes
from gspo.config.names import integration_of, integration_problem
from gspo.config.plugins import is_ref, resolve
from gspo.envs.rewards import countdown_reward, exact_match
from gspo.envs.tasks.base import Example, RewardFn, Task, call_builder
from gspo.envs.tasks.scratchpad import (
    DEFAULT_OPS,
    MAX_OPS,
    MIN_OPS,
    sample_scratchpad,
    scratchpad_key,
    scratchpad_reward,
    scratchpad_space,
)
from gspo.envs.tasks.scratchpad import DESCRIPTION as _SCRATCHPAD_DESCRIPTION

__all__ = [
    "DIFFICULTIES",
    "TASKS",
    "TaskBuilder",
    "countdown_reward",
    "make_task",
    "max_lengths",
    "split_of",
]

_TEST_BUCKETS = 10
"""One bucket out of this many (by problem hash) is the test split."""


def split_of(key: str) -> str:
    """ "test" or "train" for the problem with this key, by a stable (unsalted) hash."""
    # Python's hash() is salted per process, so it would reshuffle the splits on every run.
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") % _TEST_BUCKETS == 0 else "train"


@dataclass(frozen=True)
class _Spec:
    """How to generate one task family."""

    name: str
    description: str
    default: int
    low: int
    high: int
    sample: Callable[[random.Random, int], Example]
    """Draw one problem of the given difficulty."""
    space: Callable[[int], int]
    """Upper bound on 1 / (probability of the least likely problem) for a difficulty; sizes the
    number of fruitless draws after which a split counts as exhausted."""
    reward: RewardFn
    key: Callable[[Example], str] = lambda ex: ex.prompt
    """What decides the split; problems with the same key always land in the same split."""
    identity: Callable[[Example], str] = lambda ex: ex.prompt
    """What makes two draws the same problem within a split (an image task's prompt text
    repeats: its drawing parameters tell problems apart)."""


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------


def _operand_range(digits: int) -> tuple[int, int]:
    # One digit includes 0; more digits means no leading zero, so the prompt length is fixed.
    return (0, 9) if digits == 1 else (10 ** (digits - 1), 10**digits - 1)


def _sample_addition(rng: random.Random, digits: int) -> Example:
    low, high = _operand_range(digits)
    a, b = rng.randint(low, high), rng.randint(low, high)
    answer = str(a + b)
    meta = {"difficulty": digits, "a": a, "b": b}
    return Example(prompt=f"{a}+{b}=", answer=answer, demo=answer, meta=meta)


def _addition_key(example: Example) -> str:
    # a+b and b+a are the same fact: keep them in one split so test is not train mirrored.
    a, b = example.meta["a"], example.meta["b"]
    return f"{min(a, b)}+{max(a, b)}"


def _addition_space(digits: int) -> int:
    low, high = _operand_range(digits)
    return (high - low + 1) ** 2


def _sample_reversal(rng: random.Random, length: int) -> Example:
    text = "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
    answer = text[::-1]
    return Example(prompt=f"rev:{text}=", answer=answer, demo=answer, meta={"difficulty": length})


def _sample_sorting(rng: random.Random, count: int) -> Example:
    digits = "".join(rng.choice(string.digits) for _ in range(count))
    answer = "".join(sorted(digits))
    return Example(prompt=f"sort:{digits}=", answer=answer, demo=answer, meta={"difficulty": count})


# Countdown. Operator precedence for printing: atoms 3, * and / 2, + and - 1.
_COUNTDOWN_MAX_TARGET = 99
"""Targets are 1..99 so prompts stay short; the sum of all numbers always qualifies."""


def _countdown_high(count: int) -> int:
    return 20 if count >= 4 else 9


def _join(left: tuple[str, int], op: str, right: tuple[str, int]) -> tuple[str, int]:
    """Print ``left op right`` with only the parentheses precedence requires."""
    prec = 1 if op in "+-" else 2
    left_text, left_prec = left
    right_text, right_prec = right
    if left_prec < prec:
        left_text = f"({left_text})"
    # Same-precedence right operands need parentheses only after - and /: a-(b+c), a/(b*c).
    if right_prec < prec or (right_prec == prec and op in "-/"):
        right_text = f"({right_text})"
    return f"{left_text}{op}{right_text}", prec


def _expand(numbers: tuple[int, ...]) -> dict[int, tuple[str, int]]:
    """All values reachable using every number exactly once, each with one expression.

    The search keeps intermediate results positive integers (exact division only), which is
    the classic game and fast with plain ints; the reward itself accepts any exact expression.
    """
    if len(numbers) == 1:
        return {numbers[0]: (str(numbers[0]), 3)}
    results: dict[int, tuple[str, int]] = {}
    n = len(numbers)
    # Every split into two non-empty groups once: the first group always holds index 0, and
    # both operand orders are tried for - and /.
    for mask in range(1, 1 << n):
        if not mask & 1 or mask == (1 << n) - 1:
            continue
        left = _reachable(tuple(x for i, x in enumerate(numbers) if mask >> i & 1))
        right = _reachable(tuple(x for i, x in enumerate(numbers) if not mask >> i & 1))
        for a, a_expr in left.items():
            for b, b_expr in right.items():
                candidates = [(a + b, a_expr, "+", b_expr), (a * b, a_expr, "*", b_expr)]
                if a > b:
                    candidates.append((a - b, a_expr, "-", b_expr))
                elif b > a:
                    candidates.append((b - a, b_expr, "-", a_expr))
                if a % b == 0:
                    candidates.append((a // b, a_expr, "/", b_expr))
                if b % a == 0:
                    candidates.append((b // a, b_expr, "/", a_expr))
                for value, x, op, y in candidates:
                    if value not in results:
                        results[value] = _join(x, op, y)
    return results


# Sub-multisets recur across problems; caching them makes drawing a new problem cheap.
_reachable = functools.lru_cache(maxsize=8192)(_expand)


@functools.lru_cache(maxsize=16384)
def _countdown_targets(numbers: tuple[int, ...]) -> tuple[tuple[int, str], ...]:
    """(target, expression) pairs for a sorted multiset, in ascending target order."""
    reachable = _expand(numbers)
    return tuple(
        (value, reachable[value][0])
        for value in sorted(reachable)
        # A target equal to a given number would be solved by just writing that number.
        if value <= _COUNTDOWN_MAX_TARGET and value not in numbers
    )


def _sample_countdown(rng: random.Random, count: int) -> Example:
    # Sorted so that one multiset of numbers has one prompt (no order variants across splits).
    numbers = tuple(sorted(rng.randint(1, _countdown_high(count)) for _ in range(count)))
    target, expression = rng.choice(_countdown_targets(numbers))
    prompt = f"cd:{','.join(map(str, numbers))}>{target}="
    meta = {"difficulty": count, "numbers": list(numbers), "target": target}
    return Example(prompt=prompt, answer=str(target), demo=expression, meta=meta)


def _countdown_space(count: int) -> int:
    return _countdown_high(count) ** count * _COUNTDOWN_MAX_TARGET


_SPECS: dict[str, _Spec] = {
    spec.name: spec
    for spec in [
        _Spec(
            name="addition",
            description="Add two numbers: '37+45=' -> '82'. Difficulty = digits per operand.",
            default=2,
            low=1,
            high=9,
            sample=_sample_addition,
            space=_addition_space,
            reward=exact_match,
            key=_addition_key,
        ),
        _Spec(
            name="reversal",
            description="Reverse lowercase letters: 'rev:abcde=' -> 'edcba'. Difficulty = length.",
            default=5,
            low=1,
            high=20,
            sample=_sample_reversal,
            space=lambda length: 26**length,
            reward=exact_match,
        ),
        _Spec(
            name="sorting",
            description="Sort digits: 'sort:52813=' -> '12358'. Difficulty = number of digits.",
            default=5,
            low=1,
            high=20,
            sample=_sample_sorting,
            space=lambda count: 10**count,
            reward=exact_match,
        ),
        _Spec(
            name="countdown",
            description=(
                "Reach the target with + - * / and parentheses, each number at most once: "
                "'cd:3,5,7>22=' -> e.g. '3*5+7'. Difficulty = how many numbers "
                "(1..9 each; 1..20 at difficulty 4)."
            ),
            default=3,
            low=2,
            high=4,
            sample=_sample_countdown,
            space=_countdown_space,
            reward=countdown_reward,
        ),
        _Spec(
            name="scratchpad",
            description=_SCRATCHPAD_DESCRIPTION,
            default=DEFAULT_OPS,
            low=MIN_OPS,
            high=MAX_OPS,
            sample=sample_scratchpad,
            space=scratchpad_space,
            reward=scratchpad_reward,
            key=scratchpad_key,
        ),
        _Spec(
            name="shapes",
            description=_shapes.DESCRIPTION,
            default=_shapes.DEFAULT_SHAPES,
            low=_shapes.MIN_SHAPES,
            high=_shapes.MAX_SHAPES,
            sample=_shapes.sample_shapes,
            space=_shapes.shapes_space,
            reward=scratchpad_reward,  # the same answer rule: the text after the last ','
            key=_shapes.shapes_key,
            identity=_shapes.shapes_key,
        ),
    ]
}


# --------------------------------------------------------------------------------------------
# Building tasks
# --------------------------------------------------------------------------------------------


def _draw(spec: _Spec, difficulty: int, split: str, n: int, seed: int) -> list[Example]:
    """``n`` problems of one split, distinct while the split's problem space allows."""
    # One stream per split, so the test set does not change when n_train does. String seeds
    # are hashed with SHA-512 by random.Random, so they are stable across processes.
    rng = random.Random(f"{spec.name}/{difficulty}/{seed}/{split}")
    # After this many fruitless draws in a row the split is taken to be exhausted: even the
    # least likely missing problem would have shown up with probability 1 - e^-30.
    patience = 30 * spec.space(difficulty) + 1000
    examples: list[Example] = []
    seen: set[str] = set()
    misses = 0
    while len(examples) < n and misses < patience:
        example = spec.sample(rng, difficulty)
        identity = spec.identity(example)
        if identity in seen or split_of(spec.key(example)) != split:
            misses += 1
            continue
        misses = 0
        seen.add(identity)
        examples.append(example)
    if len(examples) < n:
        if split == "test" or not examples:
            raise ValueError(
                f"task {spec.name!r} at difficulty {difficulty} has only {len(examples)} "
                f"distinct {split} problems, {n} requested; lower n_{split} or raise difficulty"
            )
        # Train may repeat problems: a tiny problem space is still useful to train on.
        distinct = list(examples)
        examples.extend(rng.choice(distinct) for _ in range(n - len(distinct)))
    return examples


def _build(
    spec: _Spec, *, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None
) -> Task:
    if difficulty is None:
        difficulty = spec.default
    if isinstance(difficulty, bool) or not isinstance(difficulty, int):
        raise ValueError(f"difficulty of task {spec.name!r} must be an int, got {difficulty!r}")
    if not spec.low <= difficulty <= spec.high:
        raise ValueError(
            f"difficulty of task {spec.name!r} must be in [{spec.low}, {spec.high}], "
            f"got {difficulty}"
        )
    for label, n in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{label} must be a non-negative int, got {n!r}")
    return Task(
        name=spec.name,
        train=_draw(spec, difficulty, "train", n_train, seed),
        test=_draw(spec, difficulty, "test", n_test, seed),
        reward=spec.reward,
        description=f"{spec.description} (difficulty {difficulty}, seed {seed})",
    )


TaskBuilder = Callable[..., Task]
"""``builder(*, n_train, n_test, seed=0, difficulty=None) -> Task``; a builder may also accept
the run's file arguments (``train_file, test_file, prompt_key, answer_key, answer_format``):
it is passed those of them its signature names (:func:`gspo.envs.tasks.base.call_builder`)."""

TASKS: dict[str, TaskBuilder] = {
    name: functools.partial(_build, spec) for name, spec in _SPECS.items()
}
"""Built-in task builders by name: addition, reversal, sorting, countdown, scratchpad, shapes."""


def register_task(name: str):
    """Register a task builder under ``name`` (``builder(*, n_train, n_test, seed=0,
    difficulty=None) -> Task``), for ``--task NAME``; a decorator."""

    def decorator(builder: TaskBuilder) -> TaskBuilder:
        TASKS[name] = builder
        return builder

    return decorator


INTEGRATION_TASKS: dict[str, Callable[..., Task]] = {}
"""The task builders of outside packages by prefix (gspo.envs.integrations fills it): ``--task
PREFIX:NAME`` builds ``INTEGRATION_TASKS[PREFIX](NAME, *, n_train, n_test, seed, difficulty)``."""


DIFFICULTIES: dict[str, tuple[int, int, int]] = {
    name: (spec.low, spec.default, spec.high) for name, spec in _SPECS.items()
}
"""(lowest, default, highest) difficulty of each built-in task."""


def make_task(
    name: str,
    *,
    n_train: int,
    n_test: int,
    seed: int = 0,
    difficulty: int | None = None,
    **files: Any,
) -> Task:
    """Build the task ``name``: a registered one (difficulty None = that task's default), or
    the builder ``module:builder`` names (imported now). ``files`` (``train_file``,
    ``test_file``, ``prompt_key``, ...) reach the builders whose signature takes them.

    Raises ValueError for an unknown name (listing the valid ones), a difficulty outside the
    task's range (naming it), or a test split larger than the task's test problem space.
    """
    prefix = integration_of(name)
    if prefix is not None:  # an outside package's task, e.g. textarena:GuessTheNumber-v0
        problem = integration_problem(name)
        if problem is not None:
            raise ValueError(problem)
        builder = functools.partial(INTEGRATION_TASKS[prefix], name.partition(":")[2].strip())
    elif is_ref(name):
        builder = resolve("task", name)
    else:
        try:
            builder = TASKS[name]
        except KeyError:
            raise ValueError(f"unknown task {name!r}; valid names: {', '.join(TASKS)}") from None
    return call_builder(
        builder, n_train=n_train, n_test=n_test, seed=seed, difficulty=difficulty, **files
    )


def max_lengths(task: Task) -> tuple[int, int]:
    """(longest prompt, longest demo) in characters over both splits.

    Examples without a demo count their answer instead, so the second number is always a
    usable bound for sizing ``max_new_tokens``. An empty task gives (0, 0).
    """
    examples = [*task.train, *task.test]
    longest_prompt = max((len(ex.prompt) for ex in examples), default=0)
    longest_demo = max(
        (len(ex.demo if ex.demo is not None else ex.answer) for ex in examples), default=0
    )
    return longest_prompt, longest_demo
