"""Data checks of a task's splits: duplicate problems within a split and held-out problems that
also appear in training, counted for every task (data files and procedural generators alike)
and, with ``dedupe``, dropped; and a held-out set that ends up empty, which stops the run
(an evaluation of nothing would log a silent 0).

Two rows are the same problem when their prompts are equal after whitespace is collapsed (a
trailing newline or a doubled space does not make a new problem) and their answers are equal:
an environment whose opening prompt is always the same (``guess 1-16:``) differs in its answer,
and is a repeat only when that repeats too. The first occurrence of a problem is kept.
"""

from __future__ import annotations

import dataclasses
import sys

from gspo.envs.tasks.base import Example, Task

__all__ = ["EmptyHeldOutError", "check_duplicates", "check_held_out", "problem_key"]


class EmptyHeldOutError(ValueError):
    """A run that evaluates has no held-out problem left (``gspo`` exits 2 with its line)."""


def problem_key(example: Example) -> tuple[str, str, str]:
    """What two rows are compared by: the prompt with whitespace runs collapsed, the answer, and
    ``meta["problem"]`` where a task sets it (a game whose opening comes from the environment's
    ``reset`` has one prompt for every row: its seed is the problem)."""
    problem = str(example.meta.get("problem", ""))
    return " ".join(example.prompt.split()), example.answer.strip(), problem


def _first_of_each(examples: list[Example]) -> tuple[list[int], int]:
    """(indices of each prompt's first occurrence, number of later repeats)."""
    seen: set[str] = set()
    kept: list[int] = []
    for i, e in enumerate(examples):
        key = problem_key(e)
        if key not in seen:
            seen.add(key)
            kept.append(i)
    return kept, len(examples) - len(kept)


def check_duplicates(task: Task, *, dedupe: bool = False, echo: bool = True) -> Task:
    """``task`` with its ``data_checks`` counts set (``data/duplicates``: training rows that
    repeat an earlier training row's problem; ``data/test_duplicates``: the same within the
    held-out split; ``data/train_test_overlap``: held-out rows whose problem is also a training
    one). With ``dedupe`` those rows are dropped (the first of each prompt stays; an
    overlapping held-out row goes, the training row stays). A line on stderr says what was
    found and, with ``dedupe``, dropped; nothing is printed for clean data."""
    train_kept, train_dups = _first_of_each(task.train)
    test_kept, test_dups = _first_of_each(task.test)
    train_keys = {problem_key(e) for e in task.train}
    overlapping = {i for i, e in enumerate(task.test) if problem_key(e) in train_keys}
    counts = {
        "data/duplicates": train_dups,
        "data/test_duplicates": test_dups,
        "data/train_test_overlap": len(overlapping),
    }
    found = train_dups or test_dups or overlapping
    if echo and found:
        verb = "dropped" if dedupe else "kept (--dedupe true drops them)"
        print(
            f"data: task {task.name}: {train_dups} duplicate training problems, {test_dups} "
            f"duplicate held-out problems, {len(overlapping)} held-out problems also in "
            f"training; {verb}",
            file=sys.stderr,
            flush=True,
        )
    if not dedupe:
        return dataclasses.replace(task, data_checks={**task.data_checks, **counts})
    train = [task.train[i] for i in train_kept]
    test = [task.test[i] for i in test_kept if i not in overlapping]
    return dataclasses.replace(
        task, train=train, test=test, data_checks={**task.data_checks, **counts}
    )


def check_held_out(before: Task, after: Task, test_file: str | None, needed: bool) -> Task:
    """``after`` (``before`` with the data checks applied), or :class:`EmptyHeldOutError` when
    the run evaluates (``needed``) and its held-out set was asked for (a test file, or held-out
    rows built) but is empty: every row malformed and skipped, or all dropped by ``dedupe``."""
    if not needed or after.test:
        return after
    if before.test:
        raise EmptyHeldOutError(
            f"the held-out set is empty: dedupe dropped all {len(before.test)} held-out problems "
            f"of task {before.name} (each repeats a training problem or an earlier held-out one); "
            "give held-out rows that differ from the training rows, or set dedupe false"
        )
    if test_file is not None:
        # (load_examples refuses a file without rows: here every row was malformed and skipped)
        mine = [m for m in before.skipped_rows if m.startswith(str(test_file))]
        first = f"; the first: {mine[0]}" if mine else ""
        raise EmptyHeldOutError(
            f"the held-out set is empty: every row of {test_file} was skipped as malformed "
            f"(bad_rows='skip'){first}"
        )
    return after
