"""verifiers 0.4 tasksets as gspo tasks and agent environments, named on the command line:
``--task verifiers:TASKSET`` (e.g. ``verifiers:vf_arith``), the taskset module importable from
the working directory or installed, as ``vf-eval --env.taskset.id`` finds it.

Options after the taskset id, comma-separated ``key=value`` (Python literals), are the
taskset's config fields: ``verifiers:vf_arith,num_tasks=1000,max_operand=9``. The agent runs
the taskset's own harness, else gspo's offline chat harness, in a ``subprocess`` runtime
(:func:`gspo.envs.verifiers_v1.load_env`); an agent or env config beyond the taskset's needs
the plugin form, ``register_verifiers_v1`` (docs/verifiers.md).
"""

from __future__ import annotations

from typing import Any

from gspo.config.plugins import cwd_on_path
from gspo.envs.base import INTEGRATION_ENVS
from gspo.envs.tasks.base import Task
from gspo.envs.tasks.synthetic import INTEGRATION_TASKS
from gspo.envs.verifiers_v1 import VerifiersV1Env, load_env, verifiers_v1_task

from .options import parse_name

PREFIX = "verifiers"
_ENVS: dict[str, Any] = {}
"""The loaded v1 envs by task name: a run's task and its environment share one."""


def _env(spec: str) -> Any:
    if spec not in _ENVS:
        taskset_id, options = parse_name(PREFIX, spec)
        cwd_on_path()  # the taskset module may be in the working directory, as --plugin's
        _ENVS[spec] = load_env(taskset_id, taskset=options)
    return _ENVS[spec]


def build(
    spec: str, *, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None
) -> Task:
    """The task ``verifiers:SPEC``: the taskset's first ``n_test`` tasks held out, the next
    ``n_train`` to train on (:func:`gspo.envs.verifiers_v1.verifiers_v1_task`)."""
    if difficulty is not None:
        raise ValueError(f"--task {PREFIX}:{spec}: --difficulty does not apply (set the "
                         "taskset's own fields after its id)")  # fmt: skip
    return verifiers_v1_task(_env(spec), f"{PREFIX}:{spec}", n_train, n_test)


def make_env(task: Task, opts: Any, chat: bool) -> VerifiersV1Env:
    """The agent environment of a ``verifiers:SPEC`` task."""
    return VerifiersV1Env(_env(task.name.partition(":")[2]), task.name)


INTEGRATION_TASKS[PREFIX] = build
INTEGRATION_ENVS[PREFIX] = make_env
