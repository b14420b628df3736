"""Environments: single- and multi-turn episodes behind one protocol (:mod:`gspo.envs.base`),
token-in token-out trajectories, the multi-turn rollout driver, per-turn credit and tools."""

from gspo.envs.base import ENVIRONMENTS, Environment, SingleTurnEnv, Step, env_for, register_env

__all__ = ["ENVIRONMENTS", "Environment", "SingleTurnEnv", "Step", "env_for", "register_env"]
