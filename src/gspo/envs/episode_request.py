"""What an episode driver is asked to run: ``n`` episodes of each example, on one engine.

:func:`gspo.envs.driver.run_episodes` makes one and hands it to the driver of the environment's
kind (:func:`gspo.envs.driver.run_one_turn`, :func:`gspo.envs.agent_driver.run_agent_episodes`),
so that neither spells the arguments out again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gspo.envs.tasks.base import Example
from gspo.rollout.base import GenerationRequest, Rollout, SamplingParams


@dataclass(frozen=True)
class EpisodeRequest:
    """``n`` episodes of each example (group after group: episode j of ``examples[i]`` is row
    ``i * n + j``)."""

    engine: Any
    """Samples the policy's turns (the rollout protocol's ``generate``)."""
    env: Any
    """The environment (:class:`gspo.envs.base.Environment` or an agent environment)."""
    encoder: Any
    """Encodes prompts and replies (:mod:`gspo.envs.trajectory`)."""
    examples: list[Example]
    n: int
    params: SamplingParams
    limits: Any
    """The episode limits (:class:`gspo.envs.driver.Limits`)."""
    generator: torch.Generator | None = None
    prompts: list[list[int]] | None = None
    """The examples' prompt ids when the caller has them (the trainer's prompt cache); None:
    the encoder's."""
    generate: Callable[[GenerationRequest], Rollout] | None = None
    """Runs each round instead of ``engine.generate`` (the async producer's hook)."""
