"""Engine-trainer agreement after every step: the contract every rollout engine and training
backend must keep.

An engine that holds its own copy of the weights must, after each optimizer step and its weight
sync, record log-probs equal to a recompute pass of the trainer's model (float64, tight), at a
temperature other than 1. A stale copy (a missed or partial sync), a different temperature or
a different log-prob convention breaks it.

Two levels, each parametrized so that new engines and backends join the same test:
* ``ENGINE_FACTORIES``: engines driven by a loop written here (generate, the trainer's update,
  ``update_weights``); a vLLM engine adds one entry.
* ``RUN_SETTINGS``: config settings that select the engine/backend ``gspo.compose.train.train`` builds;
  the run's own recompute pass logs the disagreement (``mismatch/max_abs``) at every step. A vLLM
  engine or Ray backend adds its settings here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from update_support import update_batch

import gspo.backend.update as update_module
import gspo.compose.train as trainer_module
from gspo.config import TrainConfig, build
from gspo.core.losses import group_advantages
from gspo.envs.tasks.base import Example, Task
from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import Rollout, RolloutEngine, SamplingParams
from gspo.rollout.base import GenerationRequest
from gspo.rollout.torch_engine import TorchEngine

TEMPERATURE = 0.7
STEPS = 3
TOLERANCE = 1e-10
"""float64 engine and trainer: differences are rounding (~1e-15); one optimizer step at the
learning rates below moves log-probs by ~1e-2."""

EngineFactory = Callable[[torch.nn.Module], RolloutEngine]

ENGINE_FACTORIES: dict[str, EngineFactory] = {
    # An own float64 copy, fast decoder (static KV cache) and the Hugging Face forward.
    "torch-copy": lambda model: TorchEngine(
        model, pad_id=PAD_ID, eos_id=EOS_ID, share_weights=False
    ),
    "torch-copy-hf": lambda model: TorchEngine(
        model, pad_id=PAD_ID, eos_id=EOS_ID, share_weights=False, fast=False
    ),
}

RUN_SETTINGS: dict[str, dict] = {
    "torch-copy-float64": {"engine_dtype": "float64"},
}


def even_share(text: str, example: Example) -> float:
    return sum(ord(c) % 2 == 0 for c in text) / len(text) if text else 0.0


def even_task() -> Task:
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    return Task("even", train=examples[:12], test=examples[12:], reward=even_share)


def contract_cfg(tmp_path, **overrides) -> TrainConfig:
    values = {
        "device": "cpu",
        "output_dir": str(tmp_path),
        "dtype": "float64",
        "temperature": TEMPERATURE,
        "steps": STEPS,
        "lr": 1e-2,
        "warmup_steps": 0,
        "algo": "grpo",
        "max_new_tokens": 6,
        **overrides,
    }
    return build(TrainConfig, preset="smoke", overrides=values)


def recompute(model, rollout: Rollout) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = token_logprobs(
            model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=TEMPERATURE,
        )
    return lp  # [N, L]


def max_disagreement(model, rollout: Rollout) -> float:
    mask = rollout.completion_mask.bool()
    return float((rollout.logprobs - recompute(model, rollout)).abs()[mask].max())


@pytest.fixture(params=sorted(ENGINE_FACTORIES))
def engine_factory(request) -> EngineFactory:
    return ENGINE_FACTORIES[request.param]


def run_engine_loop(tmp_path, factory: EngineFactory, *, sync: bool) -> list[float]:
    """STEPS rounds of generate -> the trainer's update -> (sync): the disagreement of each
    round's rollout with a recompute by the trainer's model at that moment."""
    cfg = contract_cfg(tmp_path)
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=3).double()
    engine = factory(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    # Prompts of different lengths: left padding, attention masks and positions all matter.
    examples = [Example(prompt="7=", answer=""), Example(prompt="123+456=", answer="")]
    prompts = [tok(e.prompt)["input_ids"] for e in examples]
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=TEMPERATURE)
    gaps = []
    for step in range(STEPS):
        rollout = engine.generate(
            GenerationRequest(
                prompts, cfg.rollout.group_size, params, torch.Generator().manual_seed(step)
            )
        )
        gaps.append(max_disagreement(model, rollout))
        assert rollout.prompt_ids.dtype == rollout.completion_ids.dtype == torch.long
        assert rollout.prompt_mask.dtype == rollout.completion_mask.dtype == torch.long
        assert rollout.logprobs.dtype == torch.float64
        texts = tok.batch_decode(
            [
                ids[m.bool()]
                for ids, m in zip(rollout.completion_ids, rollout.completion_mask, strict=True)
            ],
            skip_special_tokens=True,
        )
        rewards = torch.tensor(
            [
                even_share(t, examples[int(i)])
                for t, i in zip(texts, rollout.prompt_index, strict=True)
            ],
            dtype=torch.float64,
        )
        advantages = group_advantages(rewards, cfg.rollout.group_size)
        metrics = update_module.update_policy(
            cfg,
            model,
            None,
            optimizer,
            scheduler,
            update_batch(rollout, rollout.logprobs, advantages, step),
        )
        assert metrics["grad_norm"] > 0  # the weights moved: a stale copy would show
        if sync:
            engine.update_weights(model)
    return gaps


def test_engine_copy_is_frozen_and_rejects_bad_sampling(engine_factory):
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=3).double()
    engine = engine_factory(model)
    assert not any(p.requires_grad for p in engine.model.parameters())
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(GenerationRequest([[5, 6]], 1, SamplingParams(top_p=1.5)))


def test_engine_log_probs_equal_a_recompute_after_every_step(tmp_path, engine_factory):
    gaps = run_engine_loop(tmp_path, engine_factory, sync=True)
    assert max(gaps) < TOLERANCE, gaps


def test_engine_contract_notices_a_missing_weight_sync(tmp_path, engine_factory):
    gaps = run_engine_loop(tmp_path, engine_factory, sync=False)
    assert gaps[0] < TOLERANCE and min(gaps[1:]) > 1e3 * TOLERANCE, gaps


@pytest.fixture(params=sorted(RUN_SETTINGS))
def run_settings(request) -> dict:
    return RUN_SETTINGS[request.param]


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_training_run_engine_agrees_with_the_trainer_at_every_step(
    tmp_path, monkeypatch, run_settings, algo
):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: even_task())
    cfg = contract_cfg(tmp_path, algo=algo, old_logprobs="recompute", **run_settings)
    result = trainer_module.train(cfg)
    records = [r for r in result.history if "reward/mean" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        assert r["grad_norm"] > 0
        assert r["mismatch/max_abs"] < TOLERANCE, (r["step"], r["mismatch/max_abs"])
