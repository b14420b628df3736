"""Async multi-turn episodes: the rollout thread runs whole episodes (``max_staleness`` >= 1).

:class:`EpisodeProducer` is the producer of :class:`~.async_source.AsyncSource` for multi-turn
tasks. It runs the step's episodes with the multi-turn driver
(:func:`gspo.envs.driver.run_episodes`) through the driver's ``generate`` hook, which the place
supplies; in process (:func:`~.async_local.round_generate`, the thread's own torch engine):

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

from ..core.seeding import step_generator
from ..rollout.base import RolloutBatch
from .async_buffer import Group
from .async_rollout import Produced, WeightSync
from .async_source import Place, StepProducer
from .steps import Parts


class Restart(Exception):
    """New weights arrived after the step's episodes started ('restart' mode)."""


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


class EpisodeProducer(StepProducer):
    """Multi-turn episodes: the step's problems, ``group_size`` episodes each, run whole by the
    environment driver with the place's round hook (``Place.round_hook``)."""

    def produce(self, step: int, weights: WeightSync, place: Place) -> Produced:
        """Run and score the episodes of ``step`` (on the rollout thread)."""
        cfg, parts = self.cfg, self.parts
        t0 = time.perf_counter()
        _, examples = self.step_problems(step)
        counts = {"async/turn_boundary_syncs": 0.0, "async/mid_turn_syncs": 0.0}
        counts["async/restarts"] = 0.0
        engine, device = place.engine, place.device
        while True:
            gen = step_generator(cfg.run.seed, step, stream=0, device=device)
            hook = place.round_hook(weights, self.mode, counts)
            try:
                got = parts.episodes.collect(
                    engine, examples, cfg.rollout.group_size, parts.params, gen, weights.version,
                    generate=hook,
                )  # fmt: skip
                break
            except Restart:  # every episode of the step again, under the newest weights
                weights.sync()
                counts["async/restarts"] += 1
        rollout, oldest, lo, hi = self.versions(got.rollout)
        rollout.extras["policy_version"] = oldest  # [N] the version that sets its staleness
        got.rollout = rollout
        payload = got.to(parts.device)
        # The step's episode/* metrics, then the producer's weight loads (async/*): the
        # trainer logs them on either side of the buffer's async/* metrics.
        payload.metrics = {**parts.episodes.report(got.trajectories), **counts}
        return Produced(lo, hi, payload, time.perf_counter() - t0)

    def batch(
        self, groups: list[Group], async_metrics: dict[str, float], parts: Parts
    ) -> RolloutBatch:
        """The episodes of the admitted groups with their advantages."""
        batch = self.admitted(groups)
        made = batch.metrics
        episodes = {k: v for k, v in made.items() if not k.startswith("async/")}
        counts = {k: v for k, v in made.items() if k.startswith("async/")}
        batch.metrics = {**episodes, **async_metrics, **counts}
        batch.times["rollout"] = async_metrics["async/trainer_idle_s"]
        return batch
