"""Faults and bad input: each is contained, counted and reported, never a deep traceback."""

from __future__ import annotations

import json
import math

import pytest
import torch

import gspo.compose.train as trainer_module
import gspo.models.forward_inputs as forward_module
from gspo.compose.parts import limit_prompts
from gspo.compose.train import train
from gspo.config import ConfigError, TrainConfig, build
from gspo.envs.tasks.base import Example, Task
from gspo.orchestration.loop import NonFiniteTrainingError


def ones_share(text: str, example: Example) -> float:
    return text.count("1") / max(len(text), 1)


def varied_task(reward=ones_share) -> Task:
    examples = [Example(prompt=f"{i}:", answer="1") for i in range(16)]
    return Task("ones", train=examples[:12], test=examples[12:], reward=reward)


def cfg_for(tmp_path, **kw) -> TrainConfig:
    base = dict(device="cpu", output_dir=str(tmp_path / "run"), steps=3, eval_every=0)
    return build(TrainConfig, preset="smoke", overrides={**base, **kw})


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_nan_logprobs_skip_updates_then_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task())
    real = forward_module.token_logprobs

    def poisoned(*args, **kwargs):
        logprobs, entropy = real(*args, **kwargs)
        return logprobs * float("nan"), entropy

    monkeypatch.setattr(forward_module, "token_logprobs", poisoned)
    initial = {}

    real_build = trainer_module.build_policy

    def remember(*args, **kw):
        model, tok = real_build(*args, **kw)
        initial.update(weights(model))
        return model, tok

    monkeypatch.setattr(trainer_module, "build_policy", remember)
    cfg = cfg_for(tmp_path, steps=10, max_bad_steps=2)
    with pytest.raises(NonFiniteTrainingError, match="2 consecutive steps"):
        train(cfg)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    assert len(steps) == 2
    assert all(r["faults/skipped_updates"] == cfg.optim.num_minibatches for r in steps)


def test_nan_weights_never_reach_the_model(tmp_path, monkeypatch):
    """One poisoned minibatch is skipped; the weights stay finite and training goes on."""
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task())
    real = forward_module.token_logprobs
    calls = {"n": 0}

    def sometimes(*args, **kwargs):
        logprobs, entropy = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            logprobs = logprobs * float("inf")
        return logprobs, entropy

    monkeypatch.setattr(forward_module, "token_logprobs", sometimes)
    result = train(cfg_for(tmp_path, steps=2))
    steps = [r for r in result.history if "reward/mean" in r]
    assert steps[0]["faults/skipped_updates"] == 1 and steps[1]["faults/skipped_updates"] == 0
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


@pytest.mark.parametrize("bad", [math.inf, math.nan, "1.0", None])
def test_non_finite_or_non_numeric_rewards_score_zero_and_are_counted(tmp_path, monkeypatch, bad):
    def reward(text, example):
        return bad if text.startswith("a") or len(text) % 2 else ones_share(text, example)

    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task(reward))
    result = train(cfg_for(tmp_path, steps=2))
    steps = [r for r in result.history if "reward/mean" in r]
    assert sum(r["reward/errors"] for r in steps) > 0
    assert all(math.isfinite(r["reward/mean"]) for r in steps)


def test_raising_reward_never_kills_the_run(tmp_path, monkeypatch):
    def reward(text, example):
        raise RuntimeError("reward service down")

    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task(reward))
    result = train(cfg_for(tmp_path, steps=2))
    steps = [r for r in result.history if "reward/mean" in r]
    assert [r["reward/errors"] for r in steps] == [8, 8]  # 2 prompts x 4 samples each step
    # All-equal rewards: zero advantages, a zero loss, no NaN anywhere.
    assert all(
        r["reward/mean"] == 0.0 and r["loss"] == 0.0 and r["grad_norm"] == 0.0 for r in steps
    )


def test_malformed_rows_fatal_or_skipped_with_count(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [
        {"prompt": "1+1=", "answer": "2"},
        {"prompt": "", "answer": "3"},
        {"prompt": "2+2=", "answer": None},
    ]
    rows += [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kw = dict(task="file", train_file=str(data), reward="exact_match", steps=1)
    with pytest.raises(ValueError, match=r"train.jsonl row 1 \(line 2\): field 'prompt' is empty"):
        train(cfg_for(tmp_path, **kw))
    result = train(cfg_for(tmp_path, bad_rows="skip", **kw))
    data_record = next(r for r in result.history if "data/skipped_rows" in r)
    assert data_record["data/skipped_rows"] == 2 and data_record["data/train_problems"] == 6


def test_long_prompts_rejected_truncated_or_skipped():
    prompts = [[1, 2], [1, 2, 3, 4, 5], [9]]
    with pytest.raises(ValueError, match="training problem 1 has a 5-token prompt"):
        limit_prompts(prompts, 3, "error")
    kept, replaced, n_trunc, n_skip = limit_prompts(prompts, 3, "truncate")
    assert kept == [0, 1, 2] and replaced == {1: [3, 4, 5]} and (n_trunc, n_skip) == (1, 0)
    kept, replaced, n_trunc, n_skip = limit_prompts(prompts, 3, "skip")
    assert kept == [0, 2] and replaced == {} and (n_trunc, n_skip) == (0, 1)
    assert limit_prompts(prompts, 0, "error")[0] == [0, 1, 2]


def test_long_prompts_counted_in_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task())
    # "<bos>" + "10:" is 4 tokens; single-digit prompts are 3.
    result = train(cfg_for(tmp_path, steps=1, max_prompt_tokens=3, long_prompts="skip"))
    record = next(r for r in result.history if "data/prompts_skipped" in r)
    assert record["data/prompts_skipped"] == 2 and record["data/train_problems"] == 10


def test_unwritable_output_folder_fails_before_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(PermissionError, match="is not writable"):
        train(cfg_for(tmp_path, output_dir=str(blocker / "run")))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(group_size=1), "group_size must be >= 2"),
        (dict(max_new_tokens=-4), "max_new_tokens must be positive"),
        (dict(clip_low=1.5), "clip_low must be in"),
        (dict(algo="ppo"), "algo must be one of"),
        (dict(long_prompts="cut"), "long_prompts must be"),
        (dict(reward_workers=-1), "reward_workers must be >= 0"),
    ],
)
def test_invalid_configs_rejected_up_front(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build(TrainConfig, preset="smoke", overrides=overrides)


def test_trainer_scores_rewards_with_reward_workers_at_once(tmp_path, monkeypatch):
    """reward_workers reaches score(): the reward only succeeds when four calls meet."""
    import threading

    barrier = threading.Barrier(4, timeout=10)

    def reward(text, example):
        barrier.wait()  # BrokenBarrierError (a reward error) unless 4 calls run at once
        return 1.0

    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task(reward))
    result = train(cfg_for(tmp_path, steps=1, reward_workers=4))
    steps = [r for r in result.history if "reward/mean" in r]
    assert steps[0]["reward/errors"] == 0 and steps[0]["reward/mean"] == 1.0


def test_hanging_reward_times_out_and_is_counted(tmp_path, monkeypatch):
    import time

    def reward(text, example):
        time.sleep(30)
        return 1.0

    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task(reward))
    t0 = time.perf_counter()
    result = train(cfg_for(tmp_path, steps=1, reward_timeout_s=0.2))
    steps = [r for r in result.history if "reward/mean" in r]
    assert time.perf_counter() - t0 < 20  # 8 calls x 0.2 s, not 8 x 30 s
    assert steps[0]["reward/errors"] == 8 and steps[0]["reward/mean"] == 0.0


def poison_logprobs(monkeypatch, which=lambda n: True) -> None:
    """Make the training forward's log-probs non-finite on the calls ``which`` selects."""
    real = forward_module.token_logprobs
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        logprobs, entropy = real(*args, **kwargs)
        calls["n"] += 1
        return (logprobs * float("nan") if which(calls["n"]) else logprobs), entropy

    monkeypatch.setattr(forward_module, "token_logprobs", poisoned)


def test_bad_step_streak_survives_a_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task())
    poison_logprobs(monkeypatch)
    kw = dict(steps=10, max_bad_steps=3, checkpoint_every=1)
    train(cfg_for(tmp_path, stop_after=2, **kw))  # two bad steps, then a planned stop
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    state = json.loads((tmp_path / "run" / "checkpoints" / latest / "state.json").read_text())
    assert state["step"] == 2 and state["bad_streak"] == 2
    # The resumed run's first step is the third bad one in a row: the run stops right there.
    with pytest.raises(NonFiniteTrainingError, match="step 3: 3 consecutive steps"):
        train(cfg_for(tmp_path, **kw), resume=True)


def test_skipped_update_does_not_step_the_scheduler(tmp_path, monkeypatch, recwarn):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: varied_task())
    poison_logprobs(monkeypatch, which=lambda n: n == 1)  # the first minibatch only
    cfg = cfg_for(tmp_path, steps=1, warmup_steps=10)
    result = train(cfg)
    step = next(r for r in result.history if "reward/mean" in r)
    assert step["faults/skipped_updates"] == 1
    # Warm-up counts updates made: one of the two minibatches updated, so lr = lr x 2/10.
    assert step["lr"] == pytest.approx(cfg.optim.lr * 2 / 10)
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]
