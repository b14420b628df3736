"""DAPO dynamic sampling (unit tests on hand-made rounds, then end-to-end on the smoke preset)
and the trainer's objective options (KL in the reward, off-policy mask, dual clip, SAPO)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import gspo.compose.train as trainer_module
from gspo.compose.train import train
from gspo.config import ConfigError, TrainConfig, build
from gspo.envs.tasks.base import Example, Task
from gspo.orchestration.dynamic_sampling import (
    concat,
    fill_batch,
    informative_groups,
    round_prompts,
)
from gspo.rollout.base import Rollout, RolloutBatch

G = 2


def fake_round(rewards: list[float], width: int, tag: int) -> RolloutBatch:
    """A round of len(rewards) rows (groups of G), completions of ``width`` tokens holding ``tag``."""
    n = len(rewards)
    return RolloutBatch(
        rollout=Rollout(
            prompt_ids=torch.full((n, 1), tag),
            prompt_mask=torch.ones(n, 1, dtype=torch.long),
            completion_ids=torch.full((n, width), tag),
            completion_mask=torch.ones(n, width, dtype=torch.long),
            logprobs=torch.full((n, width), -float(tag)),
            finish_reasons=["stop"] * n,
            prompt_index=torch.arange(n) // G,
        ),
        rewards=torch.tensor(rewards, dtype=torch.float64),
        reward_errors=1,
        task_rewards=None,
    )


def test_informative_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5000001], dtype=torch.float64)
    assert informative_groups(r, 2).tolist() == [False, True, False, True]


def test_fill_batch_keeps_informative_groups_across_rounds():
    rounds = [
        fake_round([1, 1, 0, 1, 0, 0], width=2, tag=1),  # 1 informative group of 3
        fake_round([0, 0, 1, 1, 0, 0], width=3, tag=2),  # none
        fake_round([1, 0, 0, 1, 1, 0], width=1, tag=3),  # 3, of which 2 are needed
    ]
    calls = []

    def sample(k):
        calls.append(k)
        return rounds[k]

    batch, metrics = fill_batch(sample, target_groups=3, group_size=G, max_rounds=5, pad_id=0)
    assert calls == [0, 1, 2]
    assert metrics == {"data/groups_filtered": 5.0, "data/oversample_rounds": 2.0}
    r = batch.rollout
    assert batch.rewards.tolist() == [0, 1, 1, 0, 0, 1]
    assert r.completion_ids.shape == (6, 2)  # padded to the widest kept round
    assert r.completion_ids[:, 0].tolist() == [1, 1, 3, 3, 3, 3]
    assert r.completion_mask.sum(1).tolist() == [2, 2, 1, 1, 1, 1]
    assert r.logprobs[2:, 1].tolist() == [0.0] * 4  # padding
    # Rows of a group share a prompt index; groups (of any round) never do.
    assert r.prompt_index.tolist() == [1, 1, 2, 2, 3, 3]
    assert batch.reward_errors == 2  # rounds 0 and 2 contributed


def test_fill_batch_first_round_full_is_the_round_itself():
    only = fake_round([1, 0, 0, 1], width=2, tag=1)
    batch, metrics = fill_batch(
        lambda k: only, target_groups=2, group_size=G, max_rounds=3, pad_id=0
    )
    assert metrics == {"data/groups_filtered": 0.0, "data/oversample_rounds": 0.0}
    assert torch.equal(batch.rewards, only.rewards)
    assert torch.equal(batch.rollout.completion_ids, only.rollout.completion_ids)


def test_fill_batch_bound_hit_warns_and_trains_on_what_there_is():
    rounds = [fake_round([1, 0, 0, 0, 1, 1], 2, 1), fake_round([1, 1, 0, 1, 0, 0], 2, 2)]
    with pytest.warns(RuntimeWarning, match="2 of 3 groups .* after 2 rounds"):
        batch, metrics = fill_batch(
            lambda k: rounds[k], target_groups=3, group_size=G, max_rounds=2, pad_id=0
        )
    assert metrics["data/oversample_rounds"] == 1.0 and metrics["data/groups_filtered"] == 4.0
    assert metrics["data/dynamic_sampling_short"] == 1.0
    assert batch.rewards.tolist() == [1, 0, 0, 1]
    # Whole-group minibatches: the shortfall is cut to a multiple (here 2 -> 2, 1 -> none).
    with pytest.warns(RuntimeWarning, match="the last round unfiltered"):
        batch, _ = fill_batch(
            lambda k: rounds[1], target_groups=3, group_size=G, max_rounds=1, pad_id=0,
            groups_multiple=2,
        )  # fmt: skip
    assert torch.equal(batch.rewards, rounds[1].rewards)


def test_concat_pads_prompts_left_and_refuses_engine_extras():
    a, b = fake_round([1, 0], 1, 1), fake_round([0, 1], 1, 2)
    b.rollout.prompt_ids = torch.full((2, 3), 2)
    b.rollout.prompt_mask = torch.ones(2, 3, dtype=torch.long)
    both = concat([a, b], pad_id=9).rollout
    assert both.prompt_ids[0].tolist() == [9, 9, 1] and both.prompt_mask[0].tolist() == [0, 0, 1]
    a.rollout.extras["routing"] = object()
    with pytest.raises(ValueError, match="MoE"):
        fill_batch(lambda k: a, target_groups=1, group_size=G, max_rounds=1, pad_id=0)


def test_round_prompts_deterministic_and_distinct():
    assert round_prompts(10, 4, seed=0, step=3, round_=1) == round_prompts(10, 4, 0, 3, 1)
    assert round_prompts(10, 4, 0, 3, 1) != round_prompts(10, 4, 0, 3, 2)
    assert len(set(round_prompts(10, 10, 0, 0, 1))) == 10
    assert len(round_prompts(3, 7, 0, 0, 1)) == 7  # a small train set repeats


# ---------------------------------------------------------------------------------- end to end


def char_sum(text: str, example: Example) -> float:
    """Reward a random model earns in many distinct amounts."""
    return (sum(map(ord, text)) % 97) / 97 if text else 0.0


def zero(text: str, example: Example) -> float:
    return 0.0


def task_with(reward) -> Task:
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    return Task("t", train=examples[:12], test=examples[12:], reward=reward)


def make_cfg(out: Path, **overrides) -> TrainConfig:
    base = {"device": "cpu", "threads": 0, "output_dir": str(out), "steps": 3}
    return build(TrainConfig, preset="smoke", overrides={**base, **overrides})


def train_records(result) -> list[dict]:
    return [r for r in result.history if "reward/mean" in r]


def strip(record: dict) -> dict:
    return {
        k: v
        for k, v in record.items()
        if not k.startswith(("time/", "throughput/", "data/groups", "data/oversample"))
    }


def test_dynamic_sampling_without_filtering_is_the_plain_step(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: task_with(char_sum))
    plain = train(make_cfg(tmp_path / "plain"))
    dyn = train(make_cfg(tmp_path / "dyn", dynamic_sampling=True))
    recs = train_records(dyn)
    assert all(r["data/groups_filtered"] == 0 and r["data/oversample_rounds"] == 0 for r in recs)
    assert [strip(r) for r in recs] == [strip(r) for r in train_records(plain)]


def test_dynamic_sampling_bound_hit_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: task_with(zero))
    cfg = make_cfg(tmp_path, dynamic_sampling=True, dynamic_sampling_rounds=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(cfg)
    assert sum("dynamic sampling, step" in str(w.message) for w in caught) == 3
    for r in train_records(result):
        assert r["data/oversample_rounds"] == 2.0
        assert r["data/groups_filtered"] == 3 * cfg.rollout.prompts_per_step
        assert r["advantage/zero_fraction"] == 1.0


def test_dynamic_sampling_refills_filtered_groups(tmp_path, monkeypatch):
    """A reward that is 0 for the first round of a step's prompts only (by prompt text) forces
    more rounds; every trained group then has differing rewards."""
    first = {}

    def some_zero(text: str, example: Example) -> float:
        first.setdefault(example.prompt, len(first) % 2 == 0)
        return 0.0 if first[example.prompt] else char_sum(text, example)

    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: task_with(some_zero))
    result = train(make_cfg(tmp_path, dynamic_sampling=True, dynamic_sampling_rounds=8))
    recs = train_records(result)
    assert sum(r["data/groups_filtered"] for r in recs) > 0
    assert any(r["data/oversample_rounds"] > 0 for r in recs)
    assert all(r["advantage/zero_fraction"] == 0.0 for r in recs)


@pytest.mark.parametrize(
    "overrides, metric",
    [
        (dict(kl_coef=0.1, kl_in_reward=True, kl_estimator="k3+"), "reward/kl_penalty"),
        (dict(kl_coef=0.1, kl_estimator="k2"), "kl/ref"),
        (dict(off_policy_mask=True, off_policy_mask_delta=1e-4), "opsm/masked_fraction"),
        (dict(algo="grpo", dual_clip=3.0), "clip/fraction"),
        (dict(algo="sapo", sapo_tau_pos=2.0), "ratio/mean"),
        (dict(algo="cispo"), "clip/fraction"),
        (dict(algo="gmpo"), "clip/fraction"),
        (dict(algo="sapo_seq"), "ratio/mean"),
    ],
)
def test_options_train_end_to_end(tmp_path, monkeypatch, overrides, metric):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: task_with(char_sum))
    recs = train_records(train(make_cfg(tmp_path, steps=2, **overrides)))
    assert all(metric in r for r in recs)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in recs)


def test_kl_in_reward_changes_advantages_only_through_the_reward(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: task_with(char_sum))
    recs = train_records(
        train(
            make_cfg(
                tmp_path,
                steps=2,
                kl_coef=0.5,
                kl_in_reward=True,
                num_minibatches=1,
                lr=1e-3,
                warmup_steps=0,
            )
        )
    )
    # Step 1 samples from the reference itself: the penalty is exactly 0 there.
    assert recs[0]["reward/kl_penalty"] == 0.0
    assert recs[1]["reward/kl_penalty"] > 0.0  # k3 >= 0, > 0 once the policy moved


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(algo="sapo", clip_low=0.2), "has no clip range"),
        (dict(algo="gspo", dual_clip=3.0), "dual_clip applies to grpo only"),
        (dict(algo="grpo", dual_clip=0.5), "dual_clip must be > 1"),
        (dict(kl_in_reward=True), "kl_in_reward needs kl_coef > 0"),
        (dict(kl_estimator="k5"), "kl_estimator must be one of"),
        (dict(algo="grpo", clip_low=1.5), r"clip_low must be in \[0, 1\]"),
        (dict(dynamic_sampling_rounds=0), "dynamic_sampling_rounds must be >= 1"),
        (dict(off_policy_mask_delta=-1.0), "off_policy_mask_delta must be >= 0"),
    ],
)
def test_option_config_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_cfg(tmp_path, **overrides)
    # GMPO's clips are in log space: above 1 is allowed there.
    make_cfg(tmp_path, algo="gmpo", clip_low=1.5)
