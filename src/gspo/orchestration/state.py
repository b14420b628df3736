"""What the loop works on: the built parts of a run and the per-step state (one step's batch
is a :class:`gspo.rollout.base.RolloutBatch`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gspo.config.train import TrainConfig

from ..backend.base import TrainingBackend
from ..core.seeding import step_generator
from ..envs.episodes import Episodes
from ..envs.tasks.base import Example, Task
from ..rollout.base import SamplingParams


@dataclass
class StepState:
    """The loop's own state between steps; a checkpoint saves it whole and a resume restores it.

    The RNG streams need no saved state: every random choice of step k (prompts, samples,
    minibatches, evaluation) comes from a generator seeded by (seed, k, stream), so a resumed
    run replays exactly what an unbroken run would do.
    """

    seed: int
    step: int = 0
    """RL steps (rollout + update) done so far."""
    bad_streak: int = 0
    """Consecutive steps whose every update was skipped as non-finite."""

    def generator(self, stream: int, device: torch.device) -> torch.Generator:
        """The step's generator for ``stream`` (0 sampling, 1 minibatches, 3 evaluation)."""
        return step_generator(self.seed, self.step, stream=stream, device=device)

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint's ``extra`` (``step`` is saved by the checkpoint itself)."""
        return {k: v for k, v in asdict(self).items() if k != "step"}

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any], seed: int) -> StepState:
        # bad_streak: older checkpoints have no count; seed: the config's (checked on resume).
        return cls(seed=seed, step=int(saved["step"]), bad_streak=int(saved.get("bad_streak", 0)))


@dataclass
class Parts:
    """A run's parts, built from the config by the composition root (``gspo.compose.train``)."""

    cfg: TrainConfig
    """The run's config, one object per component (``cfg.loss``, ``cfg.rollout``, ...)."""
    backend: TrainingBackend
    engine: Any
    """The rollout engine (``gspo.rollout.base``): torch, vLLM, or a pool of workers."""
    tokenizer: Any
    fmt: Any
    """The prompt format (chat template or raw prompt) and its stop tokens."""
    task: Task
    train_reward: Any
    """The training reward (the task reward, with a format bonus when one is on)."""
    train_set: list[Example]
    prompt_cache: list[list[int]]
    """Token ids of each training prompt (truncated or replaced where too long)."""
    test_set: list[Example]
    params: SamplingParams
    episodes: Episodes
    """The task's episodes through the environment driver (single-turn tasks: one turn)."""
    reward_workers: int
    device: torch.device
    output_dir: Path
    data_metrics: dict[str, float] = field(default_factory=dict)
    """``data/*`` counts logged at step 0."""
    scorer: Any = None
    """Rewards on Ray tasks (``orchestration.ray_rewards.RayScorer``; the task's environment
    scores with its ``each``, :meth:`Episodes.use_scorer`); None: in this process."""
    source: Any = None
    """Where each step's scored batch comes from (``orchestration.source.BatchSource``): the
    synchronous source, or the async one when max_staleness >= 1; None: synchronous."""
