"""Built-in synthetic tasks: determinism, disjoint splits, demos, difficulty validation."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from gspo.envs.rewards import countdown_reward
from gspo.envs.tasks import DIFFICULTIES, TASKS, Example, Task, make_task, max_lengths, split_of

NAMES = ["addition", "reversal", "sorting", "countdown", "scratchpad"]
# (task, difficulty) pairs covering defaults and the small and large ends of each range.
CASES = [
    (name, difficulty)
    for name in NAMES
    for difficulty in sorted({DIFFICULTIES[name][1], 3, DIFFICULTIES[name][2]})
    if name != "addition" or difficulty <= 4
]


def split_key(example: Example) -> str:
    """The problem identity that decides the split (addition: operands in either order)."""
    if "a" in example.meta:
        a, b = sorted((example.meta["a"], example.meta["b"]))
        return f"{a}+{b}"
    return example.prompt


@functools.cache
def build(name: str, difficulty: int | None, seed: int = 0) -> Task:
    return make_task(name, n_train=200, n_test=30, seed=seed, difficulty=difficulty)


@pytest.mark.parametrize(
    "module", ["gspo.envs.tasks.synthetic", "gspo.envs.base", "gspo.envs.rewards", "gspo.envs"]
)
def test_environment_tasks_register_whatever_is_imported_first(module: str) -> None:
    """A built-in environment registers with its task from ``gspo.envs``: importing any envs
    module alone (a fresh interpreter) leaves both registries complete."""
    code = (
        f"import {module}\n"
        "from gspo.envs.base import ENVIRONMENTS\n"
        "print(sorted(ENVIRONMENTS))\n"  # before anything else is imported
        "from gspo.envs.tasks.synthetic import TASKS\n"
        "print(sorted(set(ENVIRONMENTS) - set(TASKS)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["['calculator', 'code_feedback', 'guess']", "[]"]


def test_registry_names() -> None:
    assert list(TASKS)[: len(NAMES)] == NAMES  # modules such as word_problems register more
    with pytest.raises(ValueError, match="addition, reversal, sorting, countdown"):
        make_task("nope", n_train=1, n_test=1)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_data_different_seed_different(name: str) -> None:
    first, again = build(name, None), make_task(name, n_train=200, n_test=30)
    assert first.train == again.train
    assert first.test == again.test
    other = build(name, None, seed=1)
    assert [e.prompt for e in other.train] != [e.prompt for e in first.train]
    assert [e.prompt for e in other.test] != [e.prompt for e in first.test]


def test_test_split_does_not_depend_on_train_size() -> None:
    small = make_task("addition", n_train=5, n_test=20)
    assert small.test == build("addition", None).test[:20]


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_splits_are_disjoint_and_hash_assigned(name: str, difficulty: int) -> None:
    task = build(name, difficulty)
    assert len(task.train) == 200
    assert len(task.test) == 30
    train_prompts = {e.prompt for e in task.train}
    test_prompts = {e.prompt for e in task.test}
    assert not train_prompts & test_prompts
    assert len(test_prompts) == 30  # distinct within the split
    assert all(split_of(split_key(e)) == "test" for e in task.test)
    assert all(split_of(split_key(e)) == "train" for e in task.train)


def test_addition_keeps_commuted_problems_in_one_split() -> None:
    task = make_task("addition", n_train=300, n_test=5, difficulty=1)
    test_pairs = {frozenset((e.meta["a"], e.meta["b"])) for e in task.test}
    assert all(frozenset((e.meta["a"], e.meta["b"])) not in test_pairs for e in task.train)


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_demos_score_one_and_wrong_answers_zero(name: str, difficulty: int) -> None:
    task = build(name, difficulty)
    for example in task.train + task.test:
        assert example.demo is not None
        assert task.reward(example.demo, example) == 1.0, example
        assert task.reward(example.demo + "1", example) == 0.0, example
        assert task.reward("", example) == 0.0


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_ascii_only_and_short(name: str, difficulty: int) -> None:
    task = build(name, difficulty)
    for example in task.train + task.test:
        for text in (example.prompt, example.answer, example.demo):
            assert text is not None
            assert text.isascii() and text.isprintable(), text
        assert example.meta["difficulty"] == difficulty
    longest_prompt, longest_demo = max_lengths(task)
    assert longest_prompt <= 32  # a tiny model's context stays small
    assert longest_demo <= 32


def test_formats() -> None:
    assert build("addition", None).train[0].prompt.endswith("=")
    add = make_task("addition", n_train=50, n_test=0, difficulty=2).train
    for e in add:
        a, b = e.prompt[:-1].split("+")
        assert len(a) == len(b) == 2
        assert e.answer == e.demo == str(int(a) + int(b))
    for e in build("reversal", None).train:
        assert e.prompt.startswith("rev:") and e.answer == e.prompt[4:-1][::-1]
        assert len(e.answer) == 5 and e.answer.islower()
    for e in build("sorting", None).train:
        assert e.prompt.startswith("sort:") and e.answer == "".join(sorted(e.prompt[5:-1]))
    for e in build("countdown", None).train:
        numbers, target = e.prompt[3:-1].split(">")
        assert [int(n) for n in numbers.split(",")] == e.meta["numbers"]
        assert e.answer == target == str(e.meta["target"])
        assert all(1 <= n <= 9 for n in e.meta["numbers"])
    assert all(1 <= n <= 20 for e in build("countdown", 4).train for n in e.meta["numbers"])


def test_max_lengths() -> None:
    task = Task(
        name="t",
        train=[Example("ab", "1", demo="xyz"), Example("abcd", "12345")],
        test=[Example("a", "1", demo="x")],
        reward=lambda c, e: 0.0,
    )
    assert max_lengths(task) == (4, 5)
    assert max_lengths(Task("e", [], [], lambda c, e: 0.0)) == (0, 0)


def countdown_example(numbers: list[int], target: int) -> Example:
    return Example(prompt="", answer=str(target), meta={"numbers": numbers, "target": target})


def test_countdown_reward_rejects_cheats() -> None:
    problem = countdown_example([3, 5, 7], 22)
    assert countdown_reward("3*5+7", problem) == 1.0
    assert countdown_reward("7*3+5-5+1", problem) == 0.0  # reuses 5, invents 1
    assert countdown_reward("3*7+5-5", countdown_example([3, 5, 7], 21)) == 0.0
    assert countdown_reward("3*7", countdown_example([3, 5, 7], 21)) == 1.0  # subset is fine
    for attempt in [
        "__import__('os')",
        "__import__('os').system('true')",
        "open('x')",
        "22 if 1 else 0",
        "abc",
        "3*5+7;",
        "lambda: 22",
        "3*5+7 # comment",
        "[22][0]",
    ]:
        assert countdown_reward(attempt, problem) == 0.0, attempt


def test_every_built_task_is_scored_by_its_reward() -> None:
    for name in NAMES:
        task = build(name, None)
        example = task.test[0]
        assert task.reward("not an answer", example) == 0.0
        assert task.reward(example.demo, example) == 1.0, name  # and a right one scores 1


@pytest.mark.parametrize("name", NAMES)
def test_difficulty_validation(name: str) -> None:
    low, _, high = DIFFICULTIES[name]
    for bad in (low - 1, high + 1):
        with pytest.raises(ValueError, match=rf"\[{low}, {high}\]"):
            make_task(name, n_train=1, n_test=1, difficulty=bad)
    with pytest.raises(ValueError):
        make_task(name, n_train=1, n_test=1, difficulty="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        make_task(name, n_train=-1, n_test=1)


def test_tiny_problem_space_repeats_train_but_refuses_short_test() -> None:
    # Single-letter reversal has 26 problems in all, a handful of them test-only.
    task = make_task("reversal", n_train=100, n_test=0, difficulty=1)
    assert len(task.train) == 100
    assert len({e.prompt for e in task.train}) < 26
    with pytest.raises(ValueError, match="distinct test problems"):
        make_task("reversal", n_train=1, n_test=30, difficulty=1)
