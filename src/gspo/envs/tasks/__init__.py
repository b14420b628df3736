"""Tasks: problems with verifiable answers plus the reward that checks them.

Built-in synthetic tasks come from :func:`make_task`; user data files from
:func:`load_examples` / :func:`make_file_task` (torch-free: data is checked before a model loads).
The tasks of the built-in environments (calculator, multiply, code_feedback, guess) register
with their environments, which ``gspo.envs`` loads (as any import of ``gspo.envs.tasks`` does).
"""

from gspo.envs.tasks.base import Example, RewardFn, Task
from gspo.envs.tasks.code import sample_code_problem  # registers "code" (sandboxed unit tests)
from gspo.envs.tasks.files import DataError, load_examples, make_file_task
from gspo.envs.tasks.synthetic import (
    DIFFICULTIES,
    TASKS,
    countdown_reward,
    make_task,
    max_lengths,
    split_of,
)
from gspo.envs.tasks.word_problems import sample_word_problem  # registers "word_problems"

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
