"""Environments: single- and multi-turn episodes behind one protocol (:mod:`gspo.envs.base`),
token-in token-out trajectories, the multi-turn rollout driver, per-turn credit and tools."""

from gspo.envs.base import ENVIRONMENTS, Environment, SingleTurnEnv, Step, env_for, register_env

# The built-in environments register here, each with its task (``TASKS``): any import of a
# gspo.envs module runs this first, so both registries are complete wherever they are read.
# isort: off
from gspo.envs import calculator as _calculator  # noqa: F401
from gspo.envs import code_feedback as _code_feedback  # noqa: F401
from gspo.envs import guess as _guess  # noqa: F401
from gspo.envs.integrations import reasoning_gym_tasks as _reasoning_gym  # noqa: F401
from gspo.envs.integrations import textarena_games as _textarena  # noqa: F401
from gspo.envs.integrations import verifiers_tasks as _verifiers  # noqa: F401
# isort: on

__all__ = ["ENVIRONMENTS", "Environment", "SingleTurnEnv", "Step", "env_for", "register_env"]
