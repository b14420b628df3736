"""The built-in environments register here, each with its task (``TASKS``), and the
integrations with theirs; then each registry of ``gspo.envs`` is checked against the names
``gspo.config.names`` declares for the torch-free config checks. ``gspo.envs`` imports this
module first, so any import of a gspo.envs module fails when a declared name has no
registration or a registration no declared name, and the registries are complete wherever
they are read."""

# isort: off
from gspo.envs import calculator as _calculator  # noqa: F401
from gspo.envs import code_feedback as _code_feedback  # noqa: F401
from gspo.envs import guess as _guess  # noqa: F401
from gspo.envs.integrations import reasoning_gym_tasks as _reasoning_gym  # noqa: F401
from gspo.envs.integrations import textarena_games as _textarena  # noqa: F401
from gspo.envs.integrations import verifiers_tasks as _verifiers  # noqa: F401

# isort: on
from gspo.config.names import BUILTIN_TASKS, ENVIRONMENT_TASKS, INTEGRATIONS, declared
from gspo.envs.base import ENVIRONMENTS, INTEGRATION_ENVS
from gspo.envs.tasks.synthetic import INTEGRATION_TASKS, TASKS

declared(BUILTIN_TASKS, TASKS, "tasks")
declared(ENVIRONMENT_TASKS, ENVIRONMENTS, "environments")
declared(INTEGRATIONS, INTEGRATION_TASKS, "integrations' tasks")
declared(
    (prefix for prefix, (_, _, own_env) in INTEGRATIONS.items() if own_env),
    INTEGRATION_ENVS,
    "integrations' environments",
)
