"""The loop's named steps opened one at a time (gspo.orchestration.steps), on built parts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import gspo.compose.train as trainer_module
from gspo.backend.base import TrainingBackend
from gspo.backend.local import LocalBackend
from gspo.config import TrainConfig, build
from gspo.envs.tasks.base import Example, Task
from gspo.orchestration import steps
from gspo.orchestration.steps import StepState


def even_share(text: str, example: Example) -> float:
    return sum(ord(c) % 2 == 0 for c in text) / len(text) if text else 0.0


def even_task() -> Task:
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    return Task("even", train=examples[:12], test=examples[12:], reward=even_share)


@pytest.fixture
def parts(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: even_task())
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides={"device": "cpu", "threads": 0, "output_dir": str(tmp_path)},
    )
    return trainer_module.build_parts(cfg, Path(tmp_path))


def test_local_backend_is_a_training_backend(parts):
    assert isinstance(parts.backend, LocalBackend)
    assert isinstance(parts.backend, TrainingBackend)


def test_collect_is_seeded_by_step(parts):
    """Two collects of the same step give the same samples and rewards; another step differs."""
    a = steps.collect(parts, StepState(seed=parts.cfg.run.seed, step=3))
    b = steps.collect(parts, StepState(seed=parts.cfg.run.seed, step=3))
    c = steps.collect(parts, StepState(seed=parts.cfg.run.seed, step=4))
    n = parts.cfg.rollout.prompts_per_step * parts.cfg.rollout.group_size
    assert a.rollout.completion_ids.shape[0] == a.rewards.shape[0] == n
    assert torch.equal(a.rollout.completion_ids, b.rollout.completion_ids)
    assert torch.equal(a.rewards, b.rewards)
    assert not torch.equal(a.rollout.completion_ids, c.rollout.completion_ids)


def test_steps_of_one_rl_step(parts):
    """collect -> old_logprobs -> advantages -> update -> sync, each filling its part."""
    state = StepState(seed=parts.cfg.run.seed)
    batch = steps.collect(parts, state)
    steps.old_logprobs(parts, batch)
    # The engine shares the model: its log-probs are the old log-probs (old_logprobs='engine').
    assert torch.equal(batch.old_logprobs, batch.rollout.logprobs)
    steps.advantages(parts, batch)
    groups = batch.advantages.view(-1, parts.cfg.rollout.group_size)  # [prompts, G]
    assert torch.allclose(groups.mean(dim=1), torch.zeros_like(groups[:, 0]), atol=1e-6)
    before = [p.detach().clone() for p in parts.backend.model.parameters()]
    metrics = steps.update(parts, state, batch)
    steps.sync(parts, batch)
    assert metrics["faults/skipped_updates"] == 0
    after = list(parts.backend.model.parameters())
    assert any(not torch.equal(x, y) for x, y in zip(before, after, strict=True))
    record = steps.step_metrics(parts, batch, metrics, {})
    assert record["reward/mean"] == pytest.approx(float(batch.rewards.mean()))
    assert set(batch.times) == {"rollout", "recompute", "update", "sync"}


def test_eval_and_checkpoint_cadence(parts, tmp_path):
    run = dataclasses.replace(parts.cfg.run, eval_every=2, checkpoint_every=3, steps=5)
    parts.cfg = dataclasses.replace(parts.cfg, run=run)
    due = [s for s in range(1, 6) if steps.eval_due(parts, StepState(seed=0, step=s))]
    assert due == [2, 4, 5]  # every eval_every steps and at the run's end
    for s in range(1, 6):
        steps.checkpoint(parts, StepState(seed=0, step=s, bad_streak=s % 2), last=5)
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert saved == ["step_000003", "step_000005"]
    state = json.loads((tmp_path / "checkpoints" / "step_000005" / "state.json").read_text())
    assert StepState.from_checkpoint(state, seed=0) == StepState(seed=0, step=5, bad_streak=1)


def test_step_state_round_trip():
    state = StepState(seed=7, step=12, bad_streak=2)
    saved = {"step": state.step, **state.to_checkpoint()}
    assert StepState.from_checkpoint(saved, seed=7) == state
    # A checkpoint written before the state object existed has no bad_streak: 0.
    assert StepState.from_checkpoint({"step": 4}, seed=7) == StepState(seed=7, step=4)
