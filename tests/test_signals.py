"""The no-learning-signal warning: printed once, naming the cause and the likely fix."""

from __future__ import annotations

import pytest

import gspo.compose.train as trainer_module
from gspo.compose.train import train
from gspo.config import TrainConfig, build
from gspo.envs.tasks.base import Example, Task
from gspo.orchestration.loop import PATIENCE, SignalWatch


def test_watch_warns_once_after_several_truncated_steps():
    seen: list[str] = []
    watch = SignalWatch(8, echo=seen.append)
    for step in range(1, PATIENCE):
        assert watch.update(step, 0.95, 0.0, 0.1) is None  # not yet: a few steps can be unlucky
    message = watch.update(PATIENCE, 0.95, 0.0, 0.1)
    assert message and "95% of responses were cut off at max_new_tokens=8" in message
    assert "raise --max-new-tokens" in message
    for step in range(PATIENCE + 1, 3 * PATIENCE):
        assert watch.update(step, 1.0, 1.0, 0.0) is None
    assert seen == [message]


def test_watch_streak_must_be_unbroken():
    watch = SignalWatch(8, echo=lambda m: None)
    for step in range(1, 4 * PATIENCE):
        # every other step is fine: no warning
        assert watch.update(step, 0.9 if step % 2 else 0.1, 0.0, 0.0) is None


def test_watch_zero_advantage_fix_depends_on_the_reward():
    hard = SignalWatch(8, echo=lambda m: None)
    solved = SignalWatch(8, echo=lambda m: None)
    for step in range(1, PATIENCE + 1):
        a = hard.update(step, 0.0, 0.9, 0.02)
        b = solved.update(step, 0.0, 0.9, 0.98)
    assert "zero advantage" in a and "cold-start" in a and "easier data" in a
    assert "harder data" in b


def never_rewarded() -> Task:
    examples = [Example(prompt=f"{i}+{i}=", answer="no") for i in range(16)]
    return Task("never", train=examples[:12], test=examples[12:], reward=lambda t, e: 0.0)


@pytest.mark.slow
def test_training_run_prints_the_warning_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: never_rewarded())
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(device="cpu", output_dir=str(tmp_path), steps=2 * PATIENCE + 2),
    )
    train(cfg)
    err = capsys.readouterr().err
    assert err.count("gspo: warning: little learning signal") == 1
    assert f"up to step {PATIENCE}:" in err
    assert "max_new_tokens=4" in err and "zero advantage" in err


def test_watch_stays_quiet_in_a_run_that_learns():
    # Late in a working run, about half the groups are solved by every sample: no warning.
    watch = SignalWatch(6, echo=lambda m: None)
    for step in range(1, 4 * PATIENCE):
        assert watch.update(step, 0.0, 0.6, 0.92) is None
