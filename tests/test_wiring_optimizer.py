"""Optimizer and minibatch options reach their mechanisms: the minibatch count reaches the
optimizer, the learning rate and warmup, minibatch grouping reaches the split, max_grad_norm
reaches the clip (0 turns it off), the first minibatch is on-policy in the metrics, and micro
batches keep the minibatch denominators and reach the forward. Split from test_wiring.
"""

from __future__ import annotations

import pytest
import torch
from trainer_support import (
    _even_task,  # noqa: F401 (autouse fixture)
    train_records,
)
from wiring_support import SOURCES, cli_cfg

import gspo.compose.train as trainer_module
import gspo.models.forward_inputs as forward_module
from gspo.compose.parts import build_policy_for
from gspo.config import TrainConfig


def count_training_forwards(monkeypatch) -> list[torch.Tensor]:
    """prompt_index of every training forward with gradient (a pass-through spy)."""
    seen: list[torch.Tensor] = []
    inner = forward_module.token_logprobs

    def spy(model, *args, prompt_index=None, **kw):
        if torch.is_grad_enabled():
            seen.append(prompt_index.clone())
        return inner(model, *args, prompt_index=prompt_index, **kw)

    monkeypatch.setattr(forward_module, "token_logprobs", spy)
    return seen


@pytest.mark.parametrize("source", SOURCES)
def test_minibatch_count_reaches_the_optimizer(tmp_path, monkeypatch, source):
    # 3 prompts x 4 samples = 12 rows in 3 minibatches of 4 rows: 3 optimizer steps per step,
    # seen in the warm-up schedule lr * (k + 1) / 100 after k scheduler steps.
    cfg = cli_cfg(
        tmp_path,
        source,
        num_minibatches=3,
        prompts_per_step=3,
        group_size=4,
        warmup_steps=100,
        lr=1e-3,
        zero_advantage_split=1.0,
    )
    forwards = count_training_forwards(monkeypatch)
    result = trainer_module.train(cfg)
    lrs = [r["lr"] for r in train_records(result.history)]
    assert lrs == pytest.approx([1e-3 * 4 / 100, 1e-3 * 7 / 100], rel=1e-12)
    assert [len(f) for f in forwards] == [4] * 6
    assert "clip/fraction_off_policy" in train_records(result.history)[0]


@pytest.mark.parametrize("source", SOURCES)
def test_learning_rate_and_warmup_reach_the_optimizer(tmp_path, source):
    # 2 optimizer steps per RL step: after RL step k the schedule is at min(1, (2k + 1) / 5),
    # and stays at 1 after the warm-up; without warm-up it is 1 from the start.
    warm = cli_cfg(tmp_path / "warm", source, lr=2e-3, warmup_steps=5, steps=3)
    lrs = [r["lr"] for r in train_records(trainer_module.train(warm).history)]
    assert lrs == pytest.approx([2e-3 * 3 / 5, 2e-3, 2e-3], rel=1e-12)
    flat = cli_cfg(tmp_path / "flat", source, lr=2e-3, warmup_steps=0, steps=2)
    lrs = [r["lr"] for r in train_records(trainer_module.train(flat).history)]
    assert lrs == pytest.approx([2e-3, 2e-3], rel=1e-12)


@pytest.mark.parametrize("source", SOURCES)
def test_minibatch_grouping_reaches_the_split(tmp_path, monkeypatch, source):
    # 4 prompts x 2 samples in 2 minibatches: 'groups' puts two whole groups in each.
    cfg = cli_cfg(
        tmp_path,
        source,
        minibatch_grouping="groups",
        prompts_per_step=4,
        group_size=2,
        num_minibatches=2,
        steps=3,
        zero_advantage_split=1.0,
    )
    forwards = count_training_forwards(monkeypatch)
    trainer_module.train(cfg)
    assert len(forwards) == 6
    for prompt_index in forwards:
        counts = torch.bincount(prompt_index).tolist()
        assert sorted(c for c in counts if c) == [2, 2], prompt_index
    # The default, shuffled rows, splits some group across minibatches within these 3 steps.
    forwards.clear()
    trainer_module.train(cli_cfg(tmp_path / "shuffled", source, **_same_but_shuffled(cfg)))
    assert any(sorted(c for c in torch.bincount(f).tolist() if c) != [2, 2] for f in forwards)


def _same_but_shuffled(cfg: TrainConfig) -> dict:
    return {
        "prompts_per_step": cfg.rollout.prompts_per_step,
        "group_size": cfg.rollout.group_size,
        "num_minibatches": cfg.optim.num_minibatches,
        "steps": cfg.run.steps,
        "zero_advantage_split": 1.0,
    }


def test_max_grad_norm_reaches_the_clip_and_zero_turns_it_off(tmp_path):
    common = {"dtype": "float64", "lr": 1e-2, "warmup_steps": 0, "steps": 1, "algo": "grpo"}
    before = build_policy_for(cli_cfg(tmp_path / "x", "flags", **common), torch.device("cpu"))[0]
    runs = {
        norm: trainer_module.train(
            cli_cfg(tmp_path / str(norm), "flags", max_grad_norm=norm, **common)
        ).model.state_dict()
        for norm in (0.0, 1e-3, 1.0)
    }
    moved = {
        n: max(float((sd[k] - before.state_dict()[k]).abs().max()) for k in sd)
        for n, sd in runs.items()
    }
    assert moved[0.0] > 0  # 0: no clipping, not a zero gradient
    # A tiny norm rescales each minibatch's gradient by a different factor, which Adam's
    # per-parameter normalisation does not undo over two steps: other weights than no clip.
    assert any(not torch.equal(runs[1e-3][k], runs[0.0][k]) for k in runs[0.0])


def test_first_minibatch_is_on_policy_in_the_metrics(tmp_path):
    # Two minibatches: the first is on-policy (KL exactly 0 in float64), so the off-policy KL
    # (minibatch 2 alone) is above the KL over both.
    cfg = cli_cfg(tmp_path, "flags", algo="grpo", dtype="float64", lr=1e-2, warmup_steps=0, steps=2)
    for r in train_records(trainer_module.train(cfg).history):
        assert r["kl/old_new_off_policy"] > r["kl/old_new"] > 0


@pytest.mark.parametrize("aggregation", ["token_mean", "constant"])
def test_micro_batches_keep_the_minibatch_denominators(tmp_path, aggregation):
    # Aggregations over tokens: each micro-batch must divide by the whole minibatch's token
    # count, or micro-batching changes the update (float64, large lr: any change shows).
    common = {"algo": "grpo", "aggregation": aggregation, "dtype": "float64", "lr": 1e-2}
    common.update(steps=1, warmup_steps=0)
    whole = trainer_module.train(cli_cfg(tmp_path / "whole", "flags", **common))
    micro = trainer_module.train(cli_cfg(tmp_path / "micro", "flags", micro_batch_size=1, **common))
    sw, sm = whole.model.state_dict(), micro.model.state_dict()
    for k in sw:
        torch.testing.assert_close(sm[k], sw[k], rtol=1e-10, atol=1e-12, msg=k)


@pytest.mark.parametrize("source", SOURCES)
def test_micro_batch_size_reaches_the_forward(tmp_path, monkeypatch, source):
    # 2 prompts x 4 samples in 2 minibatches of 4 rows, micro-batches of 3: forwards of 3 and 1.
    cfg = cli_cfg(tmp_path, source, micro_batch_size=3, zero_advantage_split=1.0)
    forwards = count_training_forwards(monkeypatch)
    trainer_module.train(cfg)
    assert [len(f) for f in forwards] == [3, 1] * (cfg.run.steps * cfg.optim.num_minibatches)
