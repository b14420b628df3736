"""The one scored-rollout type (``gspo.rollout.base.RolloutBatch``): its row selection and its
move to a device keep every per-row and per-token field aligned, and the old per-stage types
are gone (one object from generation through reward, advantages and update)."""

from __future__ import annotations

import importlib

import pytest
import torch

from gspo.rollout.base import Rollout, RolloutBatch


def episodes_batch() -> RolloutBatch:
    """Two groups of two multi-turn episodes, each field tagged by its row."""
    n, width = 4, 3
    row = torch.arange(n)[:, None]  # [N, 1]
    rollout = Rollout(
        prompt_ids=torch.full((n, 2), 5) + row,
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=row * 10 + torch.arange(width),
        completion_mask=torch.ones(n, width, dtype=torch.long),
        logprobs=-(row.float() + 1) * torch.ones(n, width),
        finish_reasons=["stop", "length", "stop", "failed"],
        prompt_index=torch.tensor([0, 0, 1, 1]),
        extras={"turn_ids": row.expand(n, width).clone(), "policy_version": torch.arange(n) + 7},
        loss_mask=torch.tensor([[1, 0, 1]] * n),
        versions=(row + 3).expand(n, width).clone(),
    )
    return RolloutBatch(
        rollout,
        rewards=torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64),
        reward_errors=1,
        task_rewards=torch.tensor([0.5, 0.25, 0.125, 0.0]),
        advantages=row.float().expand(n, width).clone(),  # [N, L] per-turn credit
        trajectories=["t0", "t1", "t2", "t3"],
        old_logprobs=torch.zeros(n, width) - row,
        weights=torch.ones(n) + row.flatten(),
        metrics={"reward/task": 0.2},
    )


def test_select_keeps_every_field_of_the_listed_rows_in_order():
    b = episodes_batch()
    got = b.select(torch.tensor([3, 0]))
    r = got.rollout
    assert r.completion_ids[:, 0].tolist() == [30, 0]
    assert r.prompt_ids[:, 0].tolist() == [8, 5]
    assert r.logprobs[:, 0].tolist() == [-4.0, -1.0]
    assert r.finish_reasons == ["failed", "stop"]
    assert r.prompt_index.tolist() == [1, 0]
    assert r.loss_mask.tolist() == [[1, 0, 1]] * 2
    assert r.versions[:, 0].tolist() == [6, 3]
    assert r.extras["turn_ids"][:, 0].tolist() == [3, 0]
    assert r.extras["policy_version"].tolist() == [10, 7]
    assert got.rewards.tolist() == [3.0, 0.0] and got.task_rewards.tolist() == [0.0, 0.5]
    assert got.advantages[:, 0].tolist() == [3.0, 0.0]
    assert got.old_logprobs[:, 0].tolist() == [-3.0, 0.0]
    assert got.weights.tolist() == [4.0, 1.0]
    assert got.trajectories == ["t3", "t0"]
    # Counts and metrics describe the round: kept whole, and a copy (the source is untouched).
    assert got.reward_errors == 1 and got.metrics == {"reward/task": 0.2}
    got.metrics["x"] = 1.0
    assert "x" not in b.metrics and b.num_samples == 4 and got.num_samples == 2


def test_select_refuses_engine_extras_that_are_not_laid_out_by_row():
    b = episodes_batch()
    b.rollout.extras["routing"] = object()  # an MoE engine's [R, N, P+L, k] record
    with pytest.raises(ValueError, match="routing"):
        b.select(torch.tensor([0]))


def test_to_moves_what_the_update_reads_and_keeps_the_rewards_where_they_were_scored():
    b = episodes_batch()
    same = b.to(torch.device("cpu"))
    assert same.rollout is b.rollout  # already there: no copy
    meta = b.to(torch.device("meta"))
    r = meta.rollout
    for t in (r.prompt_ids, r.completion_ids, r.completion_mask, r.logprobs, r.loss_mask,
              r.versions, meta.advantages, meta.old_logprobs, meta.weights):  # fmt: skip
        assert t.device.type == "meta"
    # float64 rewards stay on the CPU: the group advantages are computed there, then moved.
    assert meta.rewards.device.type == "cpu" and meta.task_rewards.device.type == "cpu"
    assert b.rollout.completion_ids.device.type == "cpu"  # the original is not moved
    assert meta.trajectories == b.trajectories and meta.images is None


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("gspo.orchestration.dynamic_sampling", "Sampled"),
        ("gspo.orchestration.steps", "Batch"),
        ("gspo.orchestration.async_episodes", "EpisodeBatch"),
        ("gspo.orchestration.async_source", "select_rows"),
        ("gspo.backend.update", "_to_device"),
        ("gspo.envs.episodes", "Collected"),
    ],
)
def test_the_per_stage_types_are_gone(module, name):
    assert not hasattr(importlib.import_module(module), name)


def test_envs_loop_is_renamed_episodes():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("gspo.envs.loop")
    assert importlib.import_module("gspo.envs.episodes").Episodes
