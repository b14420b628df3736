"""Async multi-turn episodes: the rollout thread runs whole episodes (``max_staleness`` >= 1).

:class:`EpisodeSource` is :class:`~.async_source.AsyncSource` for multi-turn tasks. Its producer
runs the step's episodes with the multi-turn driver (:func:`gspo.envs.driver.run_episodes`)
on the thread's own torch engine, through the driver's ``generate`` hook (:func:`round_generate`):

- at a turn boundary (before each round of the driver) it loads the newest published weights;
- within a turn it generates with :class:`~gspo.rollout.partial.ResumableGeneration` and, when
  new weights arrive mid-turn, pauses the turn, loads them and continues it (prompt + tokens so
  far re-prefilled under the new weights, same random stream).

Every policy token keeps the engine log-prob and the version of the weights that generated it
(``Rollout.versions`` [N, L]); environment tokens and padding have NO_VERSION, no loss and no
part in staleness. An episode's staleness is its oldest policy token's version, so the
admission rule and the buffer's bound K apply unchanged, and groups stay whole.

``async_partial`` for episodes:

- ``keep``: every policy token is trained with the log-prob of the weights that made it (the
  behaviour policy of the episode, which may span versions across and within turns);
- ``mask``: policy tokens older than the episode's newest version get loss_mask 0 (earlier
  turns made under older weights stay as context, without gradient);
- ``restart``: new weights arriving after the step's episodes started (mid-turn or at a turn
  boundary) throw every episode of the step away and run them again from their prompts under
  the new weights, with the same random stream and fresh environment states, so no episode spans
  two versions (at most K restarts per step: admission bounds how far the trainer can move).

The batch carries what the synchronous path's (:func:`.steps.collect`) does: episode
returns as rewards, advantages ([N, L] with credit='turn'; else the trainer's advantages step
makes them from the returns), ``episode/*`` metrics,
``reward/final_mean``, plus ``async/*`` and ``async/turn_boundary_syncs``,
``async/mid_turn_syncs``, ``async/restarts`` (weight loads of the producer for this step). When
the buffer drops groups (not expected: admission already bounds staleness) the kept groups' rows
are selected and their advantages kept (group-normalized, so unaffected); ``episode/*`` then
still describe every episode generated for the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gspo.config.combinations import Options

from ..core.seeding import prompt_indices, step_generator
from ..rollout.base import Rollout, SamplingParams
from ..rollout.partial import ResumableGeneration, sample_versions
from ..rollout.torch_engine import TorchEngine
from .async_rollout import Produced, WeightSync
from .async_source import AsyncSource, mask_older_tokens, select_rows
from .state import Batch, Parts, StepState
from .steps import _to_device


class Restart(Exception):
    """New weights arrived after the step's episodes started ('restart' mode)."""


@dataclass
class EpisodeBatch:
    """The producer's payload for one step (rows group after group)."""

    rollout: Rollout
    returns: torch.Tensor  # [N] float64 episode returns (the batch's rewards)
    advantages: torch.Tensor | None  # [N, L] with credit='turn' (None: from the returns)
    metrics: dict[str, float]
    counts: dict[str, float] = field(default_factory=dict)


def turn_boundary(weights: WeightSync, mode: str, rounds: list[int], counts: dict) -> None:
    """Before a round of turns (no turn in flight): load newer weights, or in 'restart' mode
    raise :class:`Restart` if they arrive after the episodes started; counts the round."""
    if weights.newer():
        if mode == "restart" and rounds[0] > 0:
            raise Restart
        weights.sync()
        if rounds[0] > 0:
            counts["async/turn_boundary_syncs"] += 1
    rounds[0] += 1


def round_generate(
    engine: TorchEngine, weights: WeightSync, mode: str, counts: dict[str, float]
) -> Callable[..., Rollout]:
    """The driver's ``generate`` hook: one round of turns with weight loads at the turn
    boundary and mid-turn, each token tagged with its version; counts the loads in ``counts``."""
    rounds = [0]

    def generate(
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        turn_boundary(weights, mode, rounds, counts)
        g = ResumableGeneration(engine, prompts, n, params, generator)
        while not g.done:
            g.run(None, weights.version, stop=weights.newer)  # to the turn's end or new weights
            if weights.newer() and not g.done:
                if mode == "restart":
                    raise Restart
                g.pause()  # drop the old weights' cache, load, continue the turn
                weights.sync()
                counts["async/mid_turn_syncs"] += 1
        return g.result()

    return generate


class EpisodeProducer:
    """What an async source of multi-turn episodes adds to its base (``AsyncSource`` locally,
    ``RayAsyncSource`` on Ray): the producer runs whole episodes through the driver with the
    source's round hook (:meth:`round_hook`), and ``collect`` hands them to the trainer."""

    cfg: Options
    parts: Parts
    mode: str
    thread: Any

    def round_hook(self, weights: WeightSync, counts: dict[str, float]) -> Callable[..., Rollout]:
        """The driver's ``generate`` hook (local: the thread's torch engine, any token)."""
        return round_generate(self.engine, weights, self.mode, counts)  # type: ignore[attr-defined]

    def episode_engine(self) -> tuple[Any, torch.device]:
        """The engine the driver is handed (the hook generates) and its generators' device."""
        return self.engine, self.engine.device  # type: ignore[attr-defined]

    def _produce(self, step: int, weights: WeightSync) -> Produced:
        """Run and score the episodes of ``step`` (on the rollout thread)."""
        cfg, parts = self.cfg, self.parts
        t0 = time.perf_counter()
        idx = prompt_indices(len(parts.train_set), step, cfg.rollout.prompts_per_step, cfg.run.seed)
        examples = [parts.train_set[i] for i in idx]
        counts = {"async/turn_boundary_syncs": 0.0, "async/mid_turn_syncs": 0.0}
        counts["async/restarts"] = 0.0
        engine, device = self.episode_engine()
        while True:
            gen = step_generator(cfg.run.seed, step, stream=0, device=device)
            hook = self.round_hook(weights, counts)
            try:
                got = parts.episodes.collect(
                    engine, examples, cfg.rollout.group_size, parts.params, gen, weights.version,
                    generate=hook,
                )  # fmt: skip
                break
            except Restart:  # every episode of the step again, under the newest weights
                weights.sync()
                counts["async/restarts"] += 1
        rollout, returns, advantages = got.rollout, got.returns, got.advantages
        metrics = parts.episodes.report(got.trajectories)
        if self.mode == "mask":
            rollout = mask_older_tokens(rollout)
        oldest, newest = sample_versions(rollout)  # [N], [N]
        rollout.extras["policy_version"] = oldest  # [N] the version that sets its staleness
        payload = EpisodeBatch(_to_device(rollout, parts.device), returns, advantages, metrics)
        payload.counts = counts
        size = cfg.rollout.group_size
        lo, hi = oldest.view(-1, size).tolist(), newest.view(-1, size).tolist()
        return Produced(lo, hi, payload, time.perf_counter() - t0)

    def collect(self, parts: Parts, state: StepState) -> Batch:
        """The episodes of ``state.step`` with their advantages (blocks until produced)."""
        assert self.thread is not None, "EpisodeSource.start was not called"
        groups, async_metrics = self.thread.take(state.step)
        if not groups:
            raise RuntimeError(
                f"step {state.step}: every group was older than max_staleness="
                f"{self.cfg.asynchronous.max_staleness} and dropped"
            )
        made: EpisodeBatch = groups[0].payload
        rollout, returns, advantages = made.rollout, made.returns, made.advantages
        if (
            len(groups) < self.cfg.rollout.prompts_per_step
        ):  # some dropped: keep the admitted groups
            size = self.cfg.rollout.group_size
            slots = torch.tensor([g.key[1] for g in groups])  # [n]
            rows = (slots[:, None] * size + torch.arange(size)).reshape(-1)  # [n * G]
            extras = {k: v[rows.to(v.device)] for k, v in rollout.extras.items()}
            rollout = select_rows(rollout, rows)
            rollout.extras = extras
            returns = returns[rows]
            if advantages is not None:
                advantages = advantages[rows.to(advantages.device)]
        metrics = {**made.metrics, **async_metrics, **made.counts}
        batch = Batch(
            rollout,
            returns,
            int(made.metrics["episode/failed"]),
            metrics,
            async_metrics["async/trainer_idle_s"],
        )
        if advantages is not None:
            batch.advantages = advantages.to(parts.device)
        return batch


class EpisodeSource(EpisodeProducer, AsyncSource):
    """Scored batches of multi-turn episodes from the rollout thread (local backend)."""
