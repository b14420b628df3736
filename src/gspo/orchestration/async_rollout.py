"""Asynchronous rollouts for the local backend: a rollout thread beside the trainer.

The thread owns a torch engine on its own copy of the weights (the trainer updates its model
concurrently) and generates the scored batches of upcoming steps with the newest weights it
has. The trainer publishes a snapshot of its weights after every step (version k + 1 after the
update of step k); the thread loads it at the next token boundary. A generation still running
then is paused and continued under the new weights (:mod:`gspo.rollout.partial`).

Staleness bound K (``max_staleness``), enforced twice:

- admission (producer side, as AReaL's staleness manager): the thread starts the batch of step
  s only once it holds weights of version >= s - K, and otherwise waits (``async/rollout_idle_s``);
- the buffer (:mod:`.async_buffer`) admits a group to the batch of step s only if its oldest
  token's version is >= s - K, and drops and counts the others (``async/dropped_samples``).

So at trainer step s every sample is at most K versions behind. The trainer waits for the batch
of step s when the thread is behind (``async/trainer_idle_s``).

Partial rollouts under new weights (``async_partial``): 'keep' (default) keeps every token with
the log-prob of the weights that produced it. Those recorded log-probs are the behaviour
policy's probabilities of the sample, so the losses' ratio π_θ / π_old is the importance ratio
against what actually generated it, clipped as usual (and GSPO's sequence ratio multiplies
exactly these per-token terms). 'mask' (slime's --mask-offpolicy-in-partial-rollout) takes the
tokens generated before the newest version out of the loss; 'restart' throws the generation away
and starts the step again under the new weights (same random stream), so no sample spans two
versions. Mismatch corrections (TIS/MIS, ``mismatch_correction``) apply on top as in sync runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .async_buffer import Group, StalenessBuffer, batch_metrics


@dataclass
class Produced:
    """What the producer made for one step: one entry per group (slot order)."""

    oldest: list[list[int]]  # [groups][group_size] oldest token version per sample
    newest: list[list[int]]  # [groups][group_size]
    payload: Any  # the step's scored batch (shared by its groups)
    generate_s: float  # seconds spent generating and scoring


class WeightSink(Protocol):
    """How the trainer's new weights reach the producer's engine (in-process shared memory,
    the Ray object store): ``put`` runs on the trainer after its update and returns at once,
    ``load`` runs on the rollout thread at a token or chunk boundary."""

    def start(self, model: torch.nn.Module) -> None:
        """Give the producer's engine the trainer's current weights (before the thread runs)."""
        ...

    def put(self, model: torch.nn.Module) -> Any:
        """A copy of the weights the producer can load while the trainer keeps updating."""
        ...

    def load(self, weights: Any) -> None:
        """Load what ``put`` returned into the producer's engine (on the rollout thread)."""
        ...


class WeightSync:
    """The producer's view of the trainer's weights: the newest published snapshot and the
    version the producer's engine holds. ``load`` is called on the producer thread only."""

    def __init__(self, load: Callable[[Any], None], version: int) -> None:
        self._load = load
        self._cond = threading.Condition()
        self._snapshot: Any = None
        self._published = version
        self.version = version  # what the producer's engine holds
        self.stopped = False

    def publish(self, weights: Any, version: int) -> None:
        with self._cond:
            self._snapshot, self._published = weights, version
            self._cond.notify_all()

    def newer(self) -> bool:
        return self._published > self.version

    def sync(self) -> bool:
        """Load the newest published weights if newer than the engine's; whether it did."""
        with self._cond:
            if self._published <= self.version:
                return False
            weights, version = self._snapshot, self._published
        self._load(weights)
        self.version = version
        return True

    def wait_for(self, version: int) -> float:
        """Block until weights of at least ``version`` are published (or stop); seconds waited."""
        t0 = time.perf_counter()
        with self._cond:
            while self._published < version and not self.stopped:
                self._cond.wait(timeout=0.5)
        return time.perf_counter() - t0

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


class RolloutThread:
    """Runs ``produce(step, weights)`` for steps ``start .. end - 1`` on its own thread, at
    most K versions ahead; the trainer calls ``take(step)`` then ``publish(weights, step + 1)``.
    """

    def __init__(
        self,
        produce: Callable[[int, WeightSync], Produced],
        load: Callable[[Any], None],
        *,
        start: int,
        end: int,
        group_size: int,
        max_staleness: int,
    ) -> None:
        self.produce, self.start_step, self.end = produce, start, end
        self.k = max_staleness
        self.buffer = StalenessBuffer(group_size, max_staleness)
        self.weights = WeightSync(load, version=start)  # the engine starts at the trainer's
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._rollout_idle = 0.0
        self._generate_s: dict[int, float] = {}
        self._thread = threading.Thread(target=self._main, name="gspo-rollout", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            for step in range(self.start_step, self.end):
                idle = self.weights.wait_for(step - self.k)  # admission: at most K behind
                if self.weights.stopped:
                    return
                self.weights.sync()
                made = self.produce(step, self.weights)
                with self._cond:
                    self._rollout_idle += idle
                    for slot, (lo, hi) in enumerate(zip(made.oldest, made.newest, strict=True)):
                        self.buffer.put_group((step, slot), lo, hi, made.payload)
                    self.buffer.close(step)
                    self._generate_s[step] = made.generate_s
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the trainer by take()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def take(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """The admissible groups of ``step`` (trainer version = step) and the async metrics;
        blocks until the producer closed the step."""
        t0 = time.perf_counter()
        with self._cond:
            while not self.buffer.ready(step):
                if self._error is not None:
                    raise RuntimeError("the rollout thread failed") from self._error
                if not self._thread.is_alive():
                    raise RuntimeError(f"the rollout thread ended before step {step}")
                self._cond.wait(timeout=0.5)
            idle = time.perf_counter() - t0
            before = self.buffer.counters.dropped_stale + self.buffer.counters.dropped_partial
            groups = self.buffer.take(step, trainer_version=step)
            c = self.buffer.counters
            metrics = {
                **batch_metrics(groups, trainer_version=step),
                "async/dropped_samples": c.dropped_stale + c.dropped_partial - before,
                "async/trainer_idle_s": idle,
                "async/rollout_idle_s": self._rollout_idle,
                "async/generate_s": self._generate_s.pop(step, 0.0),
            }
            self._rollout_idle = 0.0
        return groups, metrics

    def publish(self, weights: Any, version: int) -> None:
        self.weights.publish(weights, version)

    def close(self) -> int:
        """Stop the thread (it finishes the step it is generating) and drop what it left;
        return the samples dropped (generated for steps this run will not train)."""
        self.weights.stop()
        self._thread.join()
        with self._cond:
            return self.buffer.drop_all()


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the weights the producer can load while the trainer keeps updating them."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
