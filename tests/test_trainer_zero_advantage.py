"""Rows with zero advantage: they skip the backward pass and change nothing (only without a
KL penalty), the metrics-off path skips their forward and keeps the update, and the split
share keeps a few idle rows in the gradient pass and is validated. Split from test_trainer:
CPU only, with the even-share task (trainer_support) in place of a built-in one.
"""

from __future__ import annotations

import math

import pytest
import torch
from trainer_support import (
    _even_task,  # noqa: F401 (autouse fixture)
    even_share,
    make_cfg,
    train_records,
    without_timing,
)

import gspo.backend.update as update_module
import gspo.compose.train as trainer_module
import gspo.models.forward_inputs as forward_module
from gspo.compose.parts import build_policy_for
from gspo.compose.train import train
from gspo.envs.tasks.base import Example, Task

# --------------------------------------------------------------------------------------------
# Zero-advantage rows: a no-grad forward for their metrics, no backward


def half_constant_task() -> Task:
    """Prompts "a..." earn a constant reward (a group of all-equal rewards: advantage 0 for all
    of its rows); prompts "b..." earn the varied even-share reward."""
    examples = [Example(prompt=f"{'ab'[i % 2]}{i}=", answer="") for i in range(12)]

    def reward(text: str, example: Example) -> float:
        return 0.5 if example.prompt.startswith("a") else even_share(text, example)

    return Task("half", train=examples, test=examples[:2], reward=reward)


def half_constant_cfg(monkeypatch, algo: str = "gspo", grouping: str = "shuffled"):
    """Settings for the zero-advantage tests on half_constant_task: float64 and a large lr over
    3 steps, so any difference in a gradient (or in whether Adam stepped on an all-zero
    minibatch) shows in the weights."""
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: half_constant_task())
    return {
        "algo": algo,
        "steps": 3,
        "dtype": "float64",
        "lr": 1e-2,
        "warmup_steps": 0,
        "prompts_per_step": 4,
        "group_size": 2,
        "num_minibatches": 4 if grouping == "groups" else 2,
        "minibatch_grouping": grouping,
    }


def count_forwards(monkeypatch) -> tuple[list[int], list[int]]:
    """(rows per forward with grad, rows per no-grad forward) of the training pass, filled as
    the trainer runs."""
    grad_rows, nograd_rows = [], []
    inner_logprobs = forward_module.token_logprobs

    def spy(model, *args, prompt_index=None, **kw):
        (grad_rows if torch.is_grad_enabled() else nograd_rows).append(len(prompt_index))
        return inner_logprobs(model, *args, prompt_index=prompt_index, **kw)

    monkeypatch.setattr(forward_module, "token_logprobs", spy)
    return grad_rows, nograd_rows


@pytest.mark.parametrize("grouping", ["shuffled", "groups"])
@pytest.mark.parametrize("algo", ["grpo", "gspo", "gspo_token", "luspo"])
@pytest.mark.slow
def test_zero_advantage_rows_skip_backward_and_change_nothing(
    tmp_path, monkeypatch, algo, grouping
):
    common = {
        **half_constant_cfg(monkeypatch, algo, grouping),
        "micro_batch_size": 2,
        "zero_advantage_split": 0.0,  # every zero-advantage row leaves the gradient pass
    }
    grad_forwards, nograd_forwards = count_forwards(monkeypatch)
    zeroed = []
    inner_zero = update_module._zero_grads

    def spy_zero(model):
        zeroed.append(1)
        inner_zero(model)

    monkeypatch.setattr(update_module, "_zero_grads", spy_zero)
    skipping = train(make_cfg(tmp_path / "skip", **common))
    assert nograd_forwards, "some rows must have run without a backward"
    if grouping == "groups":  # a minibatch of one constant group has no row with a gradient
        assert zeroed
    n_rows = 3 * common["prompts_per_step"] * common["group_size"]
    assert sum(grad_forwards) + sum(nograd_forwards) == n_rows  # every row ran exactly once

    grad_forwards.clear()
    nograd_forwards.clear()
    monkeypatch.setattr(
        update_module,
        "zero_gradient_rows",
        lambda cfg, model, adv: torch.zeros(adv.shape[0], dtype=torch.bool),
    )
    full = train(make_cfg(tmp_path / "full", **common))
    assert not nograd_forwards and sum(grad_forwards) == n_rows
    st, sf = skipping.model.state_dict(), full.model.state_dict()
    for k in sf:
        torch.testing.assert_close(st[k], sf[k], rtol=1e-10, atol=1e-12, msg=k)
    records = zip(train_records(skipping.history), train_records(full.history), strict=True)
    for rec_s, rec_f in records:
        assert 0 < rec_f["advantage/zero_fraction"] < 1
        for key, value in without_timing(rec_f).items():
            assert math.isclose(rec_s[key], value, rel_tol=1e-9, abs_tol=1e-12), key


def test_zero_gradient_rows_only_without_kl(tmp_path):
    cfg = make_cfg(tmp_path)
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    adv = torch.tensor([0.0, 1.0, -0.0, -1.0], dtype=torch.float64)  # [N]
    want = torch.tensor([True, False, True, False])
    assert torch.equal(update_module.zero_gradient_rows(cfg, model, adv), want)
    per_token = torch.tensor([[0.0, 0.0], [0.0, 2.0], [0.0, 0.0], [1.0, 0.0]])  # [N, T]
    assert torch.equal(update_module.zero_gradient_rows(cfg, model, per_token), want)
    with_kl = make_cfg(tmp_path, kl_coef=0.1)  # the KL term has a gradient in every row
    assert not update_module.zero_gradient_rows(with_kl, model, adv).any()


@pytest.mark.parametrize("grouping", ["shuffled", "groups"])
def test_zero_advantage_metrics_off_skips_the_forward_and_keeps_the_update(
    tmp_path, monkeypatch, grouping
):
    common = {
        **half_constant_cfg(monkeypatch, grouping=grouping),
        "micro_batch_size": 2,
        "zero_advantage_split": 0.0,
    }
    grad_forwards, nograd_forwards = count_forwards(monkeypatch)
    with_metrics = train(make_cfg(tmp_path / "all", **common))
    live_rows = sum(grad_forwards)
    grad_forwards.clear()
    nograd_forwards.clear()
    lean = train(make_cfg(tmp_path / "lean", zero_advantage_metrics=False, **common))
    assert not nograd_forwards  # the zero-advantage rows ran no forward at all
    assert sum(grad_forwards) == live_rows < 3 * 4 * 2
    sl, sa = lean.model.state_dict(), with_metrics.model.state_dict()
    for k in sa:
        torch.testing.assert_close(sl[k], sa[k], rtol=1e-10, atol=1e-12, msg=k)
    records = zip(train_records(lean.history), train_records(with_metrics.history), strict=True)
    for rec_l, rec_a in records:
        for key in ("loss", "grad_norm", "reward/mean", "advantage/zero_fraction"):
            assert math.isclose(rec_l[key], rec_a[key], rel_tol=1e-9, abs_tol=1e-12), key


def test_zero_advantage_split_share_keeps_few_idle_rows_in_the_gradient_pass(tmp_path, monkeypatch):
    common = half_constant_cfg(monkeypatch)
    grad_rows, nograd_rows = count_forwards(monkeypatch)
    split = train(make_cfg(tmp_path / "split", zero_advantage_split=0.0, **common))
    split_counts = (sum(grad_rows), sum(nograd_rows))
    grad_rows.clear()
    nograd_rows.clear()
    # 1.0: only a minibatch whose rows are all at zero advantage leaves the gradient pass.
    kept = train(make_cfg(tmp_path / "kept", zero_advantage_split=1.0, **common))
    assert split_counts[1] > 0 and sum(nograd_rows) < split_counts[1]
    assert sum(grad_rows) + sum(nograd_rows) == sum(split_counts) == 3 * 4 * 2
    sk, ss = kept.model.state_dict(), split.model.state_dict()
    for k in ss:
        torch.testing.assert_close(sk[k], ss[k], rtol=1e-10, atol=1e-12, msg=k)
    records = zip(train_records(kept.history), train_records(split.history), strict=True)
    for rec_k, rec_s in records:
        for key, value in without_timing(rec_s).items():
            assert math.isclose(rec_k[key], value, rel_tol=1e-9, abs_tol=1e-12), key


def test_zero_advantage_split_share_is_validated(tmp_path):
    with pytest.raises(ValueError, match="zero_advantage_split"):
        make_cfg(tmp_path, zero_advantage_split=1.5)
