"""Where each step's scored batch comes from: one :class:`BatchSource` protocol for sync and async.

The loop (``orchestration.loop``) pulls every step's batch from ``parts.source`` and, after the
update, publishes the new weights to it. Synchronous training is the staleness-0 source
(:class:`SyncSource`): it generates the batch when asked, with the weights the engine has now
(``steps.sync`` refreshed them after the previous update), so ``publish`` has nothing to do.
With ``max_staleness`` >= 1 the source is :class:`~.async_source.AsyncSource`: a rollout
thread generates the batches ahead of the trainer (what, where and how its weights arrive are
parts of it: see there).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from ..rollout.base import RolloutBatch
from . import steps
from .async_local import local_source
from .async_source import AsyncSource
from .ray_async import build_ray_source
from .state import Parts, StepState


@runtime_checkable
class BatchSource(Protocol):
    """What the loop pulls batches from."""

    def start(self, start: int, end: int) -> None:
        """Ready the batches of steps ``start .. end - 1`` (the trainer's weights are current:
        after a resume, the checkpoint's)."""
        ...

    def collect(self, parts: Parts, state: StepState) -> RolloutBatch:
        """The scored batch of ``state.step`` (rollout with engine log-probs, rewards)."""
        ...

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """After the update of step ``version - 1``: the weights of version ``version``."""
        ...

    def close(self) -> int:
        """Stop producing; the samples generated that no step will train on."""
        ...


class SyncSource:
    """The staleness-0 source: the step's batch is generated when the loop asks for it, by
    the run's engine with the current weights (:func:`.steps.collect`)."""

    def start(self, start: int, end: int) -> None:
        pass

    def collect(self, parts: Parts, state: StepState) -> RolloutBatch:
        return steps.collect(parts, state)  # looked up per call, as the loop always did

    def publish(self, model: torch.nn.Module, version: int) -> None:
        pass  # the loop's weight sync (steps.sync) already gave the engine the new weights

    def close(self) -> int:
        return 0


def build_source(parts: Parts, model: Any) -> BatchSource:
    """The run's batch source: synchronous when ``max_staleness`` < 1, else the async source
    for the backend and task (:func:`build_async`)."""
    if parts.cfg.asynchronous.max_staleness < 1:
        return SyncSource()
    return build_async(parts, model)


def build_async(parts: Parts, model: Any) -> AsyncSource:
    """The async source for any ``max_staleness`` (at 0 its thread waits for the newest weights
    before every step): on the Ray backend the rollout workers' (:mod:`.ray_async`), else a
    thread in this process (:mod:`.async_local`); groups or episodes as the task needs."""
    if parts.cfg.backend.backend == "ray":
        return build_ray_source(parts, model)
    return local_source(parts, model)
