"""gspo: RL from verifiable rewards with sequence-level policy optimization.

The public Python API is ``__all__`` below (listed with examples in docs/api.md); every other
module is internal and may change between releases. Importing the package is cheap and
CPU-safe: each public name is loaded on first use (so ``gspo --help`` does not pay for torch),
and optional extras (vLLM, Ray, TensorBoard, wandb) are imported only by the parts that need them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it (the one import path of each)
_HOMES = {
    # losses and advantages (pure torch functions, registries of objectives)
    "policy_loss": "gspo.core.losses",
    "register_loss": "gspo.core.objectives",
    "get_loss": "gspo.core.losses",
    "LossSpec": "gspo.core.objectives",
    "sequence_log_ratio": "gspo.core.objectives",
    "group_advantages": "gspo.core.losses",
    # the run's random streams (a loop of your own draws what gspo train draws)
    "prompt_indices": "gspo.core.seeding",
    "step_generator": "gspo.core.seeding",
    # tasks, environments and rewards
    "Task": "gspo.envs.tasks.base",
    "Example": "gspo.envs.tasks.base",
    "register_task": "gspo.envs.tasks.synthetic",
    "make_task": "gspo.envs.tasks.synthetic",
    "TASKS": "gspo.envs.tasks.synthetic",
    "Environment": "gspo.envs.base",
    "SingleTurnEnv": "gspo.envs.base",
    "Step": "gspo.envs.base",
    "Opening": "gspo.envs.base",
    "register_env": "gspo.envs.base",
    "ENVIRONMENTS": "gspo.envs.base",
    "register_reward": "gspo.envs.rewards",
    # agent environments: the agent calls the model over the OpenAI-compatible endpoint
    "AgentEnvironment": "gspo.envs.agent",
    "AgentClient": "gspo.envs.agent",
    "AgentOutcome": "gspo.envs.agent",
    "ProgramAgentEnv": "gspo.envs.program_agent",
    # the engine protocol
    "RolloutEngine": "gspo.rollout.base",
    "Rollout": "gspo.rollout.base",
    "SamplingParams": "gspo.rollout.base",
    "GenerationRequest": "gspo.rollout.base",
    "ResumableEngine": "gspo.rollout.base",
    "PartialGeneration": "gspo.rollout.base",
    "RolloutBatch": "gspo.rollout.base",
    "TorchEngine": "gspo.rollout.torch_engine",
    # models: a policy and its prompt format from a config, and log-probs of completions
    "build_policy": "gspo.models.policy",
    "build_prompt_format": "gspo.models.policy",
    "token_logprobs": "gspo.models.logprobs",
    "decode_completions": "gspo.envs.driver",
    # runs
    "TrainConfig": "gspo.config.train",
    "SFTConfig": "gspo.config.train",
    "EvalConfig": "gspo.config.eval_config",
    "train": "gspo.compose.train",
    "run_sft": "gspo.compose.sft",
    "evaluate": "gspo.compose.evaluate",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gspo' has no attribute {name!r}")
    if home.startswith("gspo.envs"):  # the registries hold every built-in task and environment
        importlib.import_module("gspo.envs.tasks")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
