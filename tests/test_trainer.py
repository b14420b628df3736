"""End-to-end tests of the RL loop (gspo.compose.train.train) on the "smoke" preset, CPU only.

A random-init model never solves a built-in task, so every reward would be 0, every advantage 0
and nothing would change. The tests therefore swap in a task whose reward a random model earns
in varying amounts: the share of completion characters with an even code point.
"""

from __future__ import annotations

import json
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
from gspo.backend import checkpoint as ckpt
from gspo.compose.parts import build_policy_for
from gspo.compose.train import train
from gspo.config import TrainConfig
from gspo.core.checkpoint_paths import latest_checkpoint
from gspo.envs.tasks.base import Example, Task
from gspo.orchestration.logging import read_metrics

DESIGN_METRICS = (
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "response_length/max",
    "clip/fraction",
    "clip/seq_fraction",
    "ratio/mean",
    "ratio/max",
    "ratio/min",
    "kl/old_new",
    "entropy",
    "grad_norm",
    "throughput/tokens_per_s",
    "time/rollout_s",
    "time/train_s",
)


def initial_state(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    return {k: v.clone() for k, v in model.state_dict().items()}


def states_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["grpo", "gspo", "gspo_token", "luspo"])
@pytest.mark.slow
def test_each_algo_trains_and_logs_design_metrics(tmp_path, algo):
    cfg = make_cfg(tmp_path, algo=algo, steps=3, lr=1e-3, warmup_steps=0)
    before = initial_state(cfg)
    result = train(cfg)

    after = result.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, f"{algo}: no parameter changed in 3 steps"

    records = train_records(result.history)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert any(r["reward/std"] > 0 for r in records), "the task must give varied rewards"
    for r in records:
        missing = [k for k in DESIGN_METRICS if k not in r]
        assert not missing, f"step {r['step']} lacks {missing}"
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                assert math.isfinite(v), f"{algo} step {r['step']}: {k}={v}"
        assert r["grad_norm"] > 0
        assert r["ratio/min"] <= r["ratio/mean"] <= r["ratio/max"]
        assert 0 <= r["clip/fraction"] <= 1 and 0 <= r["clip/seq_fraction"] <= 1
        assert r["response_length/max"] <= cfg.rollout.max_new_tokens
    assert (tmp_path / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_resume_replays_an_unbroken_run_exactly(tmp_path):
    common = {"steps": 4, "lr": 1e-3, "warmup_steps": 3, "eval_every": 2}
    cfg_a = make_cfg(tmp_path / "a", checkpoint_every=2, **common)
    run_a = train(cfg_a)

    cfg_b = make_cfg(tmp_path / "b", stop_after=2, **common)
    first = train(cfg_b)
    assert [r["step"] for r in train_records(first.history)] == [1, 2]
    assert not (tmp_path / "b" / "final").exists()
    assert latest_checkpoint(tmp_path / "b").name == "step_000002"

    cfg_b_rest = make_cfg(tmp_path / "b", **common)
    rest = train(cfg_b_rest, resume=True)

    a_late = [without_timing(r) for r in train_records(run_a.history) if r["step"] > 2]
    b_late = [without_timing(r) for r in train_records(rest.history)]
    assert [r["step"] for r in b_late] == [3, 4]
    assert b_late == a_late
    assert states_equal(run_a.model.state_dict(), rest.model.state_dict())
    assert rest.final_eval == run_a.final_eval

    # The resumed run's metrics file reads as one unbroken run: every record once, in order.
    rows_a = [without_timing(r) for r in read_metrics(tmp_path / "a" / "metrics.jsonl")]
    rows_b = [without_timing(r) for r in read_metrics(tmp_path / "b" / "metrics.jsonl")]
    assert rows_b == rows_a


@pytest.mark.slow
def test_resume_with_kl_penalty_keeps_the_initial_reference(tmp_path):
    common = {"steps": 3, "lr": 1e-3, "warmup_steps": 0, "kl_coef": 0.1}
    run_a = train(make_cfg(tmp_path / "a", **common))
    train(make_cfg(tmp_path / "b", stop_after=1, **common))
    rest = train(make_cfg(tmp_path / "b", **common), resume=True)
    a_late = [without_timing(r) for r in train_records(run_a.history) if r["step"] > 1]
    assert [without_timing(r) for r in train_records(rest.history)] == a_late
    assert states_equal(run_a.model.state_dict(), rest.model.state_dict())


def test_recompute_logs_a_small_mismatch(tmp_path):
    result = train(make_cfg(tmp_path, old_logprobs="recompute"))
    for r in train_records(result.history):
        assert 0 <= r["mismatch/mean_abs"] <= r["mismatch/max_abs"] < 1e-4
        assert r["time/recompute_s"] > 0


@pytest.mark.slow
def test_bfloat16_engine_has_a_larger_mismatch(tmp_path):
    fp32 = train(make_cfg(tmp_path / "fp32", old_logprobs="recompute"))
    bf16 = train(make_cfg(tmp_path / "bf16", old_logprobs="recompute", engine_dtype="bfloat16"))
    fp32_err = max(r["mismatch/max_abs"] for r in train_records(fp32.history))
    bf16_recs = train_records(bf16.history)
    bf16_err = min(r["mismatch/mean_abs"] for r in bf16_recs)
    # fp32: ~1e-7 (kernel rounding); bf16: ~4e-4 on a random model's near-flat distribution.
    assert fp32_err < 1e-5
    assert bf16_err > 100 * fp32_err
    for r in bf16_recs:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float))
    # Engine log-probs straight from the bf16 copy are usable as old log-probs as well.
    plain = train(make_cfg(tmp_path / "bf16-engine", engine_dtype="bfloat16"))
    assert "mismatch/mean_abs" not in train_records(plain.history)[0]


@pytest.mark.parametrize("algo", ["grpo", "gspo", "gspo_token", "luspo"])
@pytest.mark.slow
def test_gradient_accumulation_matches_whole_minibatch(tmp_path, algo):
    # float64, and a large lr so that any difference in the gradient shows in the weights.
    common = {"algo": algo, "steps": 1, "dtype": "float64", "lr": 1e-2, "warmup_steps": 0}
    whole = train(make_cfg(tmp_path / "whole", micro_batch_size=0, **common))
    micro = train(make_cfg(tmp_path / "micro", micro_batch_size=2, **common))
    rec_whole, rec_micro = train_records(whole.history)[0], train_records(micro.history)[0]
    assert rec_whole["reward/std"] > 0
    # Same rollout, so the same rewards; the accumulated gradient gives the same update.
    assert rec_whole["reward/mean"] == rec_micro["reward/mean"]
    sw, sm = whole.model.state_dict(), micro.model.state_dict()
    assert next(iter(sw.values())).dtype == torch.float64
    before = initial_state(make_cfg(tmp_path / "whole", **common))
    assert any(not torch.equal(before[k], sw[k]) for k in sw)
    for k in sw:
        torch.testing.assert_close(sm[k], sw[k], rtol=1e-10, atol=1e-12, msg=k)
    # Metrics do not depend on micro-batching either: each is pooled over what it averages
    # (ratio/mean of GSPO over sequences, clip/seq_fraction over sequences, the rest tokens).
    for key, value in without_timing(rec_whole).items():
        assert math.isclose(rec_micro[key], value, rel_tol=1e-9, abs_tol=1e-12), key


def test_kl_penalty_logs_kl_to_reference(tmp_path):
    result = train(make_cfg(tmp_path, kl_coef=0.1, steps=2, lr=1e-3, warmup_steps=0))
    records = train_records(result.history)
    assert all(r["kl/ref"] >= 0 and math.isfinite(r["kl/ref"]) for r in records)
    # The first minibatch starts from the reference itself; later ones have moved off it.
    assert records[-1]["kl/ref"] > 0


def test_stop_after_leaves_a_checkpoint(tmp_path):
    train(make_cfg(tmp_path, steps=5, stop_after=1))
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.name == "step_000001"
    assert ckpt.load_state(found)["step"] == 1
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert not (tmp_path / "final").exists()


def test_resume_without_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint") as info:
        train(make_cfg(tmp_path), resume=True)
    assert str(tmp_path / "checkpoints") in str(info.value)


@pytest.mark.slow
def test_metrics_jsonl_and_truncation_on_resume(tmp_path):
    cfg = make_cfg(tmp_path, steps=4, checkpoint_every=2, keep_checkpoints=3, stop_after=3)
    first = train(cfg)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # one JSON object per line
    assert all(isinstance(r, dict) and isinstance(r["step"], int) for r in rows)
    assert rows == [json.loads(json.dumps(r)) for r in first.history]
    assert [r["step"] for r in train_records(rows)] == [1, 2, 3]

    # Simulate a crash after step 3 was logged but before its checkpoint was written.
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step_000003")
    assert latest_checkpoint(tmp_path).name == "step_000002"
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "stale": True}) + "\n")
    train(make_cfg(tmp_path, steps=4, checkpoint_every=2, keep_checkpoints=3), resume=True)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert not any("stale" in r for r in rows)
    steps = [r["step"] for r in train_records(rows)]
    assert steps == [1, 2, 3, 4]
    # Step 3 is replayed with the values the crashed run had logged.
    replayed = train_records(rows)[2]
    assert without_timing(replayed) == without_timing(train_records(first.history)[2])


# --------------------------------------------------------------------------------------------
# Minibatch layout and per-micro-batch padding trim


def test_shuffled_minibatches_are_a_permutation_cut_evenly():
    g = torch.Generator().manual_seed(0)
    parts = update_module.minibatch_rows(24, 4, 3, "shuffled", g)
    assert [len(p) for p in parts] == [8, 8, 8]
    assert sorted(torch.cat(parts).tolist()) == list(range(24))
    # The same draw as a plain randperm of the rows (the layout runs before this option had).
    expected = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.cat(parts), expected)


def test_group_minibatches_keep_every_group_whole():
    g = torch.Generator().manual_seed(3)
    parts = update_module.minibatch_rows(24, 4, 3, "groups", g)  # 6 groups, 2 per minibatch
    assert sorted(torch.cat(parts).tolist()) == list(range(24))
    for part in parts:
        groups = sorted({int(r) // 4 for r in part})
        assert len(groups) == 2
        assert sorted(part.tolist()) == [g * 4 + j for g in groups for j in range(4)]
    # Groups are shuffled, not taken in order.
    firsts = [int(p[0]) // 4 for p in parts]
    many = [
        [
            int(p[0]) // 4
            for p in update_module.minibatch_rows(
                24, 4, 3, "groups", torch.Generator().manual_seed(s)
            )
        ]
        for s in range(10)
    ]
    assert firsts in many and len({tuple(m) for m in many}) > 1


def test_group_minibatches_reject_uneven_splits():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="split evenly into 4 minibatches"):
        update_module.minibatch_rows(24, 4, 4, "groups", g)  # 6 groups into 4
    with pytest.raises(ValueError, match="one of 'shuffled', 'groups'"):
        update_module.minibatch_rows(24, 4, 3, "random", g)


def test_config_rejects_groups_that_do_not_split(tmp_path):
    from gspo.config import ConfigError

    with pytest.raises(
        ConfigError, match="prompts_per_step=6 must be divisible by num_minibatches=4"
    ):
        make_cfg(
            tmp_path,
            prompts_per_step=6,
            group_size=2,
            num_minibatches=4,
            minibatch_grouping="groups",
        )
    with pytest.raises(ConfigError, match="minibatch_grouping must be"):
        make_cfg(tmp_path, minibatch_grouping="random")


def test_group_minibatches_train_and_run_each_prompt_once(tmp_path, monkeypatch):
    seen: list[int] = []  # distinct prompts per training forward
    inner = forward_module.token_logprobs

    def spy(model, *args, prompt_index=None, **kw):
        if torch.is_grad_enabled():
            seen.append(len(set(prompt_index.tolist())))
        return inner(model, *args, prompt_index=prompt_index, **kw)

    monkeypatch.setattr(forward_module, "token_logprobs", spy)
    cfg = make_cfg(tmp_path, minibatch_grouping="groups", steps=2, lr=1e-3, warmup_steps=0)
    result = train(cfg)
    per_minibatch = cfg.rollout.prompts_per_step // cfg.optim.num_minibatches
    assert seen == [per_minibatch] * (2 * cfg.optim.num_minibatches)
    before = initial_state(cfg)
    assert not states_equal(before, result.model.state_dict())
    assert all(math.isfinite(r["loss"]) for r in train_records(result.history))


@pytest.mark.parametrize("algo", ["grpo", "gspo", "luspo"])
def test_padding_trim_changes_nothing_but_the_work(tmp_path, monkeypatch, algo):
    # float64 and a large lr: any difference in the gradient shows in the weights.
    common = {
        "algo": algo,
        "steps": 1,
        "dtype": "float64",
        "lr": 1e-2,
        "warmup_steps": 0,
        "micro_batch_size": 2,
        "kl_coef": 0.1,  # the reference pass is trimmed too
    }
    # Prompts of 2 to 13 characters: micro-batches are narrower than the rollout's longest.
    examples = [Example(prompt="7" * (1 + i) + "=", answer="") for i in range(12)]
    task = Task("even", train=examples, test=examples[:2], reward=even_share)
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: task)
    common.update(prompts_per_step=4, group_size=2)
    widths: list[tuple[int, int, int, int]] = []
    inner_micro = update_module.micro_batch

    def spy(rollout, rows, *, cut, **kw):
        micro = inner_micro(rollout, rows, cut=cut, **kw)
        widths.append(
            (
                *micro.prompt_ids.shape[1:],
                *micro.completion_ids.shape[1:],
                *rollout.prompt_ids.shape[1:],
                *rollout.completion_ids.shape[1:],
            )
        )
        return micro

    monkeypatch.setattr(update_module, "micro_batch", spy)
    trimmed = train(make_cfg(tmp_path / "trim", **common))
    # Some micro-batch was narrower than the rollout, in its prompts or its completions.
    assert any(p < full_p or c < full_c for p, c, full_p, full_c in widths)
    monkeypatch.setattr(
        update_module,
        "micro_batch",
        lambda r, rows, *, cut, **kw: inner_micro(r, rows, cut=False, **kw),
    )
    full = train(make_cfg(tmp_path / "full", **common))
    st, sf = trimmed.model.state_dict(), full.model.state_dict()
    for k in sf:
        torch.testing.assert_close(st[k], sf[k], rtol=1e-10, atol=1e-12, msg=k)
    rec_t, rec_f = train_records(trimmed.history)[0], train_records(full.history)[0]
    for key, value in without_timing(rec_f).items():
        assert math.isclose(rec_t[key], value, rel_tol=1e-9, abs_tol=1e-12), key
