"""Moved to `gspo.envs.tasks`; this path stays so existing imports keep working.

The package re-exports the public names; each old submodule path (``gspo.tasks.base``, ...)
is an alias of the moved module, so its objects are the very same.
"""

from gspo.envs.tasks import (
    DIFFICULTIES,
    TASKS,
    DataError,
    Example,
    RewardFn,
    Task,
    countdown_reward,
    load_examples,
    make_file_task,
    make_task,
    max_lengths,
    sample_code_problem,
    sample_word_problem,
    split_of,
)

__all__ = [
    "DIFFICULTIES",
    "TASKS",
    "DataError",
    "Example",
    "RewardFn",
    "Task",
    "countdown_reward",
    "load_examples",
    "make_file_task",
    "make_task",
    "max_lengths",
    "sample_code_problem",
    "sample_word_problem",
    "split_of",
]
