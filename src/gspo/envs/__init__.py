"""Environments: single- and multi-turn episodes behind one protocol (:mod:`gspo.envs.base`),
token-in token-out trajectories, the multi-turn rollout driver, per-turn credit and tools."""

# The built-in environments register in this module, each with its task (``TASKS``), checked
# against the names gspo.config.names declares: any import of a gspo.envs module runs it first,
# so the registries are complete wherever they are read.
from gspo.envs import registered as _registered  # noqa: F401
from gspo.envs.base import ENVIRONMENTS, Environment, SingleTurnEnv, Step, env_for, register_env

__all__ = ["ENVIRONMENTS", "Environment", "SingleTurnEnv", "Step", "env_for", "register_env"]
