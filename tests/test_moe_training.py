"""Tiny MoE models in the trainer: a smoke run of each algorithm, Routing Replay (R3 with
zero routing change, and with a separate engine copy), a shared expert and dense models
(no MoE metrics), the aux loss changing the gradient only when on, an SFT cold start
reloading as MoE, and the config's MoE validation.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from update_support import update_batch

import gspo.backend.update as update_module
import gspo.compose.train as trainer_module
from gspo.compose.parts import build_policy_for
from gspo.config import ConfigError, SFTConfig, TrainConfig, build
from gspo.envs.tasks.base import Example, Task
from gspo.models import moe
from gspo.rollout.base import GenerationRequest, SamplingParams
from gspo.rollout.torch_engine import TorchEngine

ALGOS = ("grpo", "gspo", "gspo_token", "luspo")


# --------------------------------------------------------------------------------------------
# Trainer integration
# --------------------------------------------------------------------------------------------


def even_share(text: str, example: Example) -> float:
    return sum(ord(c) % 2 == 0 for c in text) / len(text) if text else 0.0


@pytest.fixture
def even_task(monkeypatch):
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    task = Task("even", train=examples[:12], test=examples[12:], reward=even_share)
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: task)


def make_cfg(out: Path, **overrides) -> TrainConfig:
    base = {"device": "cpu", "threads": 0, "output_dir": str(out), "model": "tiny-moe"}
    return build(TrainConfig, preset="smoke", overrides={**base, **overrides})


def step_records(history: list[dict]) -> list[dict]:
    return [r for r in history if "reward/mean" in r]


@pytest.mark.parametrize("algo", ALGOS)
def test_smoke_train_each_algo(tmp_path, even_task, algo):
    result = trainer_module.train(make_cfg(tmp_path, algo=algo))
    records = step_records(result.history)
    assert len(records) == 2
    for rec in records:
        for key in (
            "moe/routing_change",
            "moe/routing_change_loss",
            "moe/load_max_share",
            "moe/load_cv",
            "moe/aux_loss",
        ):
            assert math.isfinite(rec[key]), key
        assert 0.0 <= rec["moe/routing_change"] <= 1.0
        assert 1 / 8 - 1e-9 <= rec["moe/load_max_share"] <= 1 / 2 + 1e-9
    assert moe.is_moe(result.model)


@pytest.mark.parametrize(
    ("replay", "old_logprobs"),
    [("old", "recompute"), ("engine", "engine"), ("engine", "recompute")],
)
def test_smoke_train_with_replay_sees_zero_routing_change(
    tmp_path, even_task, replay, old_logprobs
):
    cfg = make_cfg(
        tmp_path,
        algo="grpo",
        routing_replay=replay,
        old_logprobs=old_logprobs,
        micro_batch_size=3,  # replayed rows must follow the micro-batch slicing
        lr=1e-2,  # large steps, so that the router's own choice does change
    )
    records = step_records(trainer_module.train(cfg).history)
    # Training forwards replay what they compare against: the loss sees no routing change ...
    if (replay, old_logprobs) != ("engine", "recompute"):
        assert all(r["moe/routing_change_loss"] == 0.0 for r in records)
    # ... although the updated router's own choice moved.
    assert any(r["moe/routing_change"] > 0 for r in records)
    if old_logprobs == "recompute":
        assert all("moe/routing_change_engine" in r for r in records)


@pytest.mark.parametrize("engine_dtype", ["bfloat16", "float64"])
def test_smoke_train_r3_with_a_separate_engine_copy(tmp_path, even_task, engine_dtype):
    """R3 records the engine's own copy (another dtype); float64 needs the eager experts."""
    cfg = make_cfg(tmp_path, routing_replay="engine", engine_dtype=engine_dtype)
    records = step_records(trainer_module.train(cfg).history)
    assert all(r["moe/routing_change_loss"] == 0.0 for r in records)


def test_smoke_train_shared_expert_and_dense_has_no_moe_metrics(tmp_path, even_task):
    records = step_records(
        trainer_module.train(make_cfg(tmp_path / "q2", shared_expert=True)).history
    )
    assert "moe/routing_change" in records[-1]
    dense = step_records(trainer_module.train(make_cfg(tmp_path / "d", model="tiny")).history)
    assert not any(k.startswith("moe/") for k in dense[-1])


def one_update(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """Weights after one ``update_policy`` call from the same model and rollout."""
    model, tok = build_policy_for(cfg, torch.device("cpu"))
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    prompts = [tok(f"{i}+{i}=")["input_ids"] for i in range(cfg.rollout.prompts_per_step)]
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens)
    rollout = moe.generate_with_routing(
        engine,
        GenerationRequest(
            prompts, cfg.rollout.group_size, params, torch.Generator().manual_seed(0)
        ),
    )
    advantages = torch.linspace(-1, 1, rollout.num_samples)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    metrics = update_module.update_policy(
        cfg,
        model,
        None,
        optimizer,
        scheduler,
        update_batch(rollout, rollout.logprobs, advantages),
    )
    assert "moe/aux_loss" in metrics
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_aux_loss_changes_the_gradient_only_when_on(tmp_path):
    base = dict(num_minibatches=1, max_grad_norm=0.0)
    off = one_update(make_cfg(tmp_path, **base))
    off_again = one_update(make_cfg(tmp_path, **base))
    on = one_update(make_cfg(tmp_path, router_aux_loss_coef=1.0, **base))
    assert all(torch.equal(off[k], off_again[k]) for k in off)
    routers = [k for k in off if k.endswith("gate.weight")]
    assert routers and any(not torch.equal(off[k], on[k]) for k in routers)
    # The aux loss depends on nothing after the last router: the final norm's update is unchanged.
    assert torch.equal(off["model.norm.weight"], on["model.norm.weight"])


def test_sft_cold_start_moe_checkpoint_reloads_as_moe(tmp_path):
    from gspo.compose.sft import run_sft

    cfg = build(
        SFTConfig,
        overrides=dict(
            model="tiny-moe",
            device="cpu",
            output_dir=str(tmp_path / "sft"),
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            n_train=32,
            n_test=4,
            steps=2,
            batch_size=8,
            router_aux_loss_coef=0.01,
            progress=False,
        ),
    )
    run_sft(cfg)
    rl = build(TrainConfig, overrides=dict(model=str(tmp_path / "sft"), device="cpu"))
    model, _ = build_policy_for(rl, torch.device("cpu"))
    assert moe.is_moe(model) and len(moe.moe_routers(model)) == 1


def test_config_validation():
    with pytest.raises(ConfigError, match="old_logprobs='recompute'"):
        build(TrainConfig, overrides=dict(model="tiny-moe", routing_replay="old"))
    with pytest.raises(ConfigError, match="needs an MoE model"):
        build(TrainConfig, overrides=dict(model="tiny", routing_replay="engine"))
    with pytest.raises(ConfigError, match="experts_top_k"):
        build(TrainConfig, overrides=dict(model="tiny-moe", num_experts=2, experts_top_k=3))
    with pytest.raises(ConfigError, match="routing_replay must be one of"):
        build(TrainConfig, overrides=dict(model="tiny-moe", routing_replay="r2"))
    cfg = build(TrainConfig, overrides=dict(model="tiny-moe", routing_replay="none"))
    assert cfg.model.routing_replay is None  # "none" on the command line means off
