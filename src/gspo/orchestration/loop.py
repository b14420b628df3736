"""The RL training loop: built parts in, one named step after another.

One step:

    prompts ─► rollout engine ─► completions + engine log-probs ─► rewards ─► group advantages
            ─► (optional) old log-prob recompute ─► num_minibatches optimizer steps
            ─► weight sync to the engine ─► metrics / eval / checkpoint

The parts (policy backend, engine, task, ...) come from the composition root (``gspo.compose.train``);
each step is a function in :mod:`gspo.orchestration.steps`. Every random choice of a step (which
prompts, which samples, which minibatch) comes from a generator seeded by (seed, step), so a run
resumed from a checkpoint replays exactly what an unbroken run would do.

Note on-policy vs off-policy: the first minibatch of a rollout is on-policy (its ratios are 1 up
to engine/trainer numerics, so GSPO's and GRPO's gradients coincide there); the later minibatches
are off-policy, which is where the algorithms differ. Metrics with the suffix ``_off_policy``
cover minibatches 2..k only.

Where each step's scored batch comes from: one :class:`BatchSource` protocol for sync and async.
The loop pulls every step's batch from ``parts.source`` and, after the update, publishes the new
weights to it. Synchronous training is the staleness-0 source (:class:`SyncSource`): it
generates the batch when asked, with the weights the engine has now (``steps.sync`` refreshed
them after the previous update), so ``publish`` has nothing to do. With ``max_staleness`` >= 1
the source is :class:`~.async_source.AsyncSource`: a rollout thread generates the batches ahead
of the trainer (what, where and how its weights arrive are parts of it: see there).

What the loop runs with. :class:`StopRequest` turns SIGINT / SIGTERM into a clean stop: the
current step finishes and a checkpoint is written; a second signal quits at once.
:class:`SignalWatch` prints one warning, once per run, when a run has had little learning
signal for several steps in a row, naming what it saw and the likely fix. Two ways a run learns
nothing while looking busy: most responses are cut at ``max_new_tokens`` (the answer never gets
written, every sample scores the same; the tiny models' default is 8 tokens), or most groups
have equal rewards for all their samples (their advantages are 0 and they add nothing to the
gradient: a task far too hard for the model, or already solved).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from gspo.config.train import TrainConfig

from ..core.checkpoint_paths import latest_checkpoint
from ..rollout.base import RolloutBatch
from . import steps
from .async_local import local_source
from .async_source import AsyncSource
from .logging import MetricsLogger, progress_bar, progress_postfix
from .ray_async import build_ray_source
from .steps import Parts, StepState


class NonFiniteTrainingError(RuntimeError):
    """Raised after ``max_bad_steps`` consecutive steps of non-finite losses or gradients."""


@dataclass
class RunResult:
    output_dir: Path
    history: list[dict[str, Any]]
    """Every metrics record logged by this process (train steps and evals)."""
    final_eval: dict[str, float]
    model: Any
    tokenizer: Any
    earlier: list[dict[str, Any]] = field(default_factory=list)
    """A resumed run's records from before this process (its metrics.jsonl up to the
    checkpoint): ``earlier + history`` is the whole run from step 0."""
    interrupted: int | None = None
    """The signal (SIGINT / SIGTERM) that stopped the run after a step, else None."""
    checkpoint: Path | None = None
    """The checkpoint written when the run stopped on a signal."""

    @property
    def run_history(self) -> list[dict[str, Any]]:
        """Every record of the run, from step 0, across resumes."""
        return [*self.earlier, *self.history]


def run(
    parts: Parts,
    state: StepState,
    logger: MetricsLogger,
    last: int,
    earlier: list[dict[str, Any]] | None = None,
) -> RunResult:
    """Steps ``state.step + 1 .. last`` of the run; the final model is exported when ``last``
    is the run's last step. SIGINT / SIGTERM stop it after the current step, with a checkpoint
    (:class:`~gspo.orchestration.loop.StopRequest`); ``earlier``: a resumed run's records."""
    with StopRequest() as stop:
        result = _steps(parts, state, logger, last, stop)
    result.earlier = list(earlier or [])
    return result


def _steps(
    parts: Parts, state: StepState, logger: MetricsLogger, last: int, stop: StopRequest
) -> RunResult:
    cfg = parts.cfg
    history: list[dict[str, Any]] = []

    def log(record: dict[str, Any]) -> None:
        logger.log(state.step, record)
        history.append({"step": state.step, **record})

    final_eval: dict[str, float] = {}
    if state.step == 0:
        log(parts.data_metrics)
        if cfg.run.eval_every > 0 and parts.test_set:
            final_eval = steps.evaluate_now(parts, state)
            log(final_eval)
    bar = _progress(cfg, state.step, last)
    # Parts built without a source (tests, tools) train synchronously.
    source = parts.source if parts.source is not None else SyncSource()
    # One warning per run when most responses hit max_new_tokens or most advantages are 0.
    watch = SignalWatch(cfg.rollout.max_new_tokens, echo=_echo(bar))
    stop.echo = _echo(bar)
    while state.step < last:
        # Rollout + rewards from the run's batch source: generated now with the current weights
        # (synchronous: staleness 0), or ahead by the rollout thread (max_staleness >= 1).
        batch = source.collect(parts, state)
        steps.old_logprobs(parts, batch)
        steps.advantages(parts, batch)
        train_metrics = steps.update(parts, state, batch)
        steps.sync(parts, batch)
        source.publish(parts.backend.model, state.step + 1)  # version step + 1 to the source
        policy_metrics = parts.backend.step_metrics(batch.rollout)  # MoE routing change
        metrics = steps.step_metrics(parts, batch, train_metrics, policy_metrics)
        state.step += 1
        skipped = train_metrics["faults/skipped_updates"] >= cfg.optim.num_minibatches
        state.bad_streak = state.bad_streak + 1 if skipped else 0
        log(metrics)
        watch.update(
            state.step,
            metrics["response/truncated_fraction"],
            metrics.get("advantage/zero_fraction", 0.0),
            metrics["reward/mean"],
        )
        check_streak(parts, state)
        if steps.eval_due(parts, state):
            final_eval = steps.evaluate_now(parts, state)
            log(final_eval)
            metrics.update(final_eval)
        wrote = steps.checkpoint(parts, state, last)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(progress_postfix(metrics))
        if stop.requested:  # after a whole step, with its checkpoint: a resume continues here
            if not wrote:
                steps.checkpoint(parts, state, last, force=True)
            break
    if bar is not None:
        bar.close()
    model = getattr(parts.backend, "model", None)
    result = RunResult(parts.output_dir, history, final_eval, model, parts.tokenizer)
    if stop.requested and state.step < last:
        result.interrupted = stop.signum
        result.checkpoint = latest_checkpoint(parts.output_dir)
    elif last == cfg.run.steps:
        parts.backend.export(parts.output_dir / "final", parts.tokenizer)
    return result


def check_streak(parts: Parts, state: StepState) -> None:
    """Stop after max_bad_steps consecutive steps whose every update was skipped."""
    if state.bad_streak >= parts.cfg.run.max_bad_steps:
        raise NonFiniteTrainingError(
            f"step {state.step}: {state.bad_streak} consecutive steps had only non-finite losses "
            f"or gradients (every update skipped); stopping. Last good checkpoint: "
            f"{latest_checkpoint(parts.output_dir)}. Lower the learning rate or check the rewards "
            "and log-probs (metrics.jsonl has faults/skipped_updates per step)."
        )


def _echo(bar):
    """Print to stderr, above the progress bar when there is one."""
    if bar is None:
        return lambda message: print(message, file=sys.stderr, flush=True)
    return lambda message: bar.write(message, file=sys.stderr)


def _progress(cfg: TrainConfig, start: int, last: int):
    if not cfg.run.progress:
        return None
    # The run's global step out of its total: a resumed run's bar starts where the checkpoint is;
    # the ETA is the average rate of this process's steps, evaluations and checkpoints included
    # (eta_s; tqdm's rate counts the steps since `initial`).
    return progress_bar(cfg.run.steps, desc=f"{cfg.loss.algo}", initial=start)


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


PATIENCE = 5
"""Consecutive steps a condition must hold before the warning (a few unlucky steps are normal)."""
TRUNCATED_SHARE = 0.5
"""A step counts when more than this share of its responses hit max_new_tokens."""
ZERO_SHARE = 0.8
"""A step counts when more than this share of its samples have zero advantage. Higher than the
truncation share: late in a run that works, half the groups agreeing (all solved) is normal."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class SignalWatch:
    """Counts the steps in a row with most responses truncated, or most advantages zero."""

    max_new_tokens: int
    echo: Callable[[str], None] = _stderr
    patience: int = PATIENCE
    truncated_share: float = TRUNCATED_SHARE
    zero_share: float = ZERO_SHARE
    warned: bool = False
    _truncated: list[float] = field(default_factory=list)
    _zero: list[float] = field(default_factory=list)

    def update(
        self, step: int, truncated_fraction: float, zero_fraction: float, reward_mean: float
    ) -> str | None:
        """Record one step; return (and print) the warning the first time one is due."""
        if self.warned:
            return None
        self._truncated = [*self._truncated, truncated_fraction][-self.patience :]
        self._zero = [*self._zero, zero_fraction][-self.patience :]
        reasons = []
        if len(self._truncated) == self.patience and min(self._truncated) > self.truncated_share:
            mean = sum(self._truncated) / self.patience
            reasons.append(
                f"{mean:.0%} of responses were cut off at max_new_tokens={self.max_new_tokens}: "
                "raise --max-new-tokens so that answers can end"
            )
        if len(self._zero) == self.patience and min(self._zero) > self.zero_share:
            mean = sum(self._zero) / self.patience
            if reward_mean >= 0.5:
                fix = "the task looks solved: use harder data (--difficulty, other problems)"
            else:
                fix = (
                    "the task looks too hard for the model: cold-start it on demonstrations "
                    "(gspo sft, then --model that folder), use easier data (--difficulty), or "
                    "raise --max-new-tokens"
                )
            reasons.append(
                f"{mean:.0%} of samples were in groups whose rewards were all equal (zero "
                f"advantage: no gradient; mean reward {reward_mean:.2f}): {fix}"
            )
        if not reasons:
            return None
        self.warned = True
        message = (
            f"gspo: warning: little learning signal in the {self.patience} steps up to step "
            f"{step}: " + "; ".join(reasons) + ". (Printed once.)"
        )
        self.echo(message)
        return message


class Interrupted(KeyboardInterrupt):
    """A second SIGINT/SIGTERM: leave at once (``finally`` blocks still close Ray, engines)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """SIGINT and SIGTERM while a loop runs: the first asks it to stop after the current step
    (which then writes a checkpoint); a second raises :class:`Interrupted` at once.

    Used as a context manager around a training loop; the previous handlers come back on exit.
    Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo: Callable[[str], None] = _stderr) -> None:
        self.echo = echo
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise Interrupted(signum)
        self.signum = signum
        name = signal.Signals(signum).name
        self.echo(
            f"gspo: {name}: stopping after the current step and writing a checkpoint "
            "(press Ctrl-C again to quit at once)"
        )

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
