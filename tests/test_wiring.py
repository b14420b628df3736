"""Wiring: each training setting, given as a command-line flag or in a config file, reaches the
place where it acts, with its own value (not dropped, not replaced by a default).

Settings are built the way ``gspo train`` builds them (its parser, then the config builder),
and checked on observable behaviour: clip shares and the loss of a pass whose ratios are set by
hand, log-probs, the rewards that reach the advantages, forward sizes and the learning-rate
schedule. Each chosen value differs from every default it could be replaced by, and the tests
check that it would make a difference.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from trainer_support import (
    _even_task,  # noqa: F401 (autouse fixture)
    even_task,
    train_records,
)
from update_support import update_batch
from wiring_support import SOURCES, cli_cfg

import gspo.backend.update as update_module
import gspo.compose.train as trainer_module
import gspo.orchestration.steps as steps_module
from gspo.compose.parts import build_policy_for
from gspo.config import ConfigError, TrainConfig
from gspo.core.losses import LOSSES, policy_loss
from gspo.envs.rewards import overlong_penalty
from gspo.envs.tasks.base import Task
from gspo.interface import cli
from gspo.models.logprobs import token_logprobs
from gspo.rollout.base import Rollout
from gspo.rollout.torch_engine import TorchEngine

# --------------------------------------------------------------------------------------------
# One minibatch with ratios set by hand: clip ranges, aggregation, KL coefficient

# Per-row ratios exp(l - o) (every token of a row, so GSPO's sequence ratio is the same number):
# the first five rows have advantage +1, the last five -1.
POS_RATIOS = (1.05, 1.1, 1.3, 1.45, 1.6)
NEG_RATIOS = (0.95, 0.9, 0.78, 0.7, 0.5)


def expected_clip_shares(
    clip_low: float, clip_high: float, meaning: str = "ratio"
) -> tuple[float, float]:
    """(low, high) shares of rows whose gradient the clip zeroes, for POS/NEG_RATIOS.
    ``meaning`` 'log-ratio' (GMPO): the bounds apply to log r, so r is kept in
    [exp(-clip_low), exp(clip_high)]; otherwise r is kept in [1 - clip_low, 1 + clip_high]."""
    n = len(POS_RATIOS) + len(NEG_RATIOS)
    if meaning == "log-ratio":
        lo, hi = math.exp(-clip_low), math.exp(clip_high)
    else:
        lo, hi = 1 - clip_low, 1 + clip_high
    high = sum(r > hi for r in POS_RATIOS) / n
    low = sum(r < lo for r in NEG_RATIOS) / n
    return low, high


def hand_set_batch(cfg: TrainConfig, model, lengths=None):
    """A rollout of 10 rows (5 tokens each, or ``lengths``), its advantages and old log-probs
    that put each row's ratio at POS/NEG_RATIOS under ``model`` at ``cfg.rollout.temperature``."""
    g = torch.Generator().manual_seed(5)
    n, p, length = 10, 3, 5
    prompt_ids = torch.randint(3, 98, (n, p), generator=g)  # [N, P]
    completion_ids = torch.randint(3, 98, (n, length), generator=g)  # [N, L]
    lengths = lengths or [length] * n
    completion_mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).long()
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=torch.zeros(n, length, dtype=torch.float64),
        finish_reasons=["length"] * n,
        prompt_index=torch.arange(n),
    )
    with torch.no_grad():
        current, _ = token_logprobs(
            model,
            prompt_ids,
            rollout.prompt_mask,
            completion_ids,
            completion_mask,
            temperature=cfg.rollout.temperature,
        )  # [N, L]
    log_r = torch.tensor(POS_RATIOS + NEG_RATIOS, dtype=torch.float64).log()  # [N]
    old = (current - log_r[:, None]) * completion_mask  # [N, L]
    advantages = torch.tensor([1.0] * 5 + [-1.0] * 5, dtype=torch.float64)  # [N]
    return rollout, old, advantages, current


def one_update(cfg: TrainConfig, model, rollout, old, advantages, ref_model=None) -> dict:
    """The trainer's update of one rollout batch; its metrics."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    return update_module.update_policy(
        cfg,
        model,
        ref_model,
        optimizer,
        scheduler,
        update_batch(rollout, old, advantages),
    )


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("algo", sorted(LOSSES))
def test_clip_range_reaches_the_loss(tmp_path, algo, source):
    clip_low, clip_high = 0.25, 0.4
    meaning = LOSSES[algo].clip_meaning
    flags = dict(algo=algo, clip_low=clip_low, clip_high=clip_high)
    if meaning == "unused":  # SAPO's soft gate has no clip: the flags are refused, not ignored
        with pytest.raises(ConfigError, match="clip"):
            cli_cfg(tmp_path, source, **flags)
        return
    cfg = cli_cfg(tmp_path, source, **flags, dtype="float64", num_minibatches=1)
    assert (cfg.loss.clip_low, cfg.loss.clip_high) == (clip_low, clip_high)
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    rollout, old, advantages, _ = hand_set_batch(cfg, model)
    metrics = one_update(cfg, model, rollout, old, advantages)
    want = expected_clip_shares(clip_low, clip_high, meaning)
    # The hand-set ratios tell these bounds from the swapped ones and from every paper default.
    alternatives = [expected_clip_shares(clip_high, clip_low, meaning)]
    alternatives += [
        expected_clip_shares(s.clip_low, s.clip_high, meaning)
        for s in LOSSES.values()
        if s.clip_meaning == meaning
    ]
    assert want not in alternatives
    got = (metrics["clip/low_fraction"], metrics["clip/high_fraction"])
    assert got == pytest.approx(want, abs=1e-12)
    lo, hi = min(NEG_RATIOS), max(POS_RATIOS)
    if meaning == "log-ratio":  # GMPO reports its ratio after the log-space clip
        lo, hi = max(lo, math.exp(-clip_low)), min(hi, math.exp(clip_high))
    assert metrics["ratio/min"] == pytest.approx(lo, rel=1e-9)
    assert metrics["ratio/max"] == pytest.approx(hi, rel=1e-9)


def expected_loss(cfg: TrainConfig, current, old, advantages, mask, **kw) -> float:
    loss, _ = policy_loss(
        cfg.loss.algo,
        current,
        old,
        advantages,
        mask,
        clip_low=cfg.loss.clip_low,
        clip_high=cfg.loss.clip_high,
        constant=cfg.loss.loss_constant or float(cfg.rollout.max_new_tokens),
        **kw,
    )
    return float(loss)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum", "constant"])
def test_aggregation_and_loss_constant_reach_the_loss(tmp_path, aggregation, source):
    cfg = cli_cfg(
        tmp_path,
        source,
        algo="grpo",
        aggregation=aggregation,
        loss_constant=7.0,
        dtype="float64",
        num_minibatches=1,
    )
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    lengths = [1, 2, 3, 4, 5, 5, 4, 3, 2, 1]  # unequal lengths: the aggregations differ
    rollout, old, advantages, current = hand_set_batch(cfg, model, lengths)
    mask = rollout.completion_mask
    metrics = one_update(cfg, model, rollout, old, advantages)
    want = expected_loss(cfg, current, old, advantages, mask, aggregation=aggregation)
    assert metrics["loss"] == pytest.approx(want, rel=1e-10)
    default = expected_loss(cfg, current, old, advantages, mask)  # the paper default
    assert not math.isclose(want, default, rel_tol=1e-3)
    if aggregation == "constant":  # C = loss_constant, not max_new_tokens
        plain = expected_loss(cfg, current, old, advantages, mask, aggregation=aggregation)
        cfg_c = cli_cfg(tmp_path, source, algo="grpo", aggregation=aggregation, dtype="float64")
        by_max_new = expected_loss(cfg_c, current, old, advantages, mask, aggregation=aggregation)
        assert plain == want and not math.isclose(want, by_max_new, rel_tol=1e-3)


@pytest.mark.parametrize("source", SOURCES)
def test_kl_coefficient_reaches_the_loss(tmp_path, source):
    kl_coef = 0.37
    cfg = cli_cfg(
        tmp_path, source, algo="gspo", kl_coef=kl_coef, dtype="float64", num_minibatches=1
    )
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    ref = update_module._frozen_copy(model)
    with torch.no_grad():  # a reference away from the policy, so the KL term is not 0
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    rollout, old, advantages, current = hand_set_batch(cfg, model)
    mask = rollout.completion_mask
    with torch.no_grad():
        ref_lp, _ = token_logprobs(ref, *_tensors(rollout), temperature=cfg.rollout.temperature)
    metrics = one_update(cfg, model, rollout, old, advantages, ref_model=ref)
    want = expected_loss(cfg, current, old, advantages, mask, ref_logprobs=ref_lp, kl_coef=kl_coef)
    assert metrics["loss"] == pytest.approx(want, rel=1e-10)
    for other in (0.0, 0.1, 1.0):
        lost = expected_loss(
            cfg, current, old, advantages, mask, ref_logprobs=ref_lp, kl_coef=other
        )
        assert not math.isclose(want, lost, rel_tol=1e-4)
    assert metrics["kl/ref"] > 0


def _tensors(rollout: Rollout):
    return (
        rollout.prompt_ids,
        rollout.prompt_mask,
        rollout.completion_ids,
        rollout.completion_mask,
    )


# --------------------------------------------------------------------------------------------
# Whole runs: temperature, overlong penalty, minibatches, micro-batches


def capture_rollouts(monkeypatch) -> list[Rollout]:
    """Every rollout the trainer's engine produces, as it produced it (a pass-through)."""
    seen: list[Rollout] = []
    inner = TorchEngine.generate

    def spy(engine, request):
        rollout = inner(engine, request)
        seen.append(rollout)
        return rollout

    monkeypatch.setattr(TorchEngine, "generate", spy)
    return seen


@pytest.mark.parametrize("source", SOURCES)
def test_temperature_reaches_the_engine_and_the_training_forward(tmp_path, monkeypatch, source):
    temperature = 0.6
    cfg = cli_cfg(
        tmp_path,
        source,
        algo="grpo",  # token ratios: every token's log-prob is compared
        temperature=temperature,
        dtype="float64",
        num_minibatches=1,  # every update on-policy: ratios are 1 up to rounding
        steps=2,
        lr=1e-3,
        warmup_steps=0,
    )
    initial, _ = build_policy_for(cfg, torch.device("cpu"))
    rollouts = capture_rollouts(monkeypatch)
    result = trainer_module.train(cfg)

    # Engine: its log-probs are those of logits / 0.6 (not / 1) under the initial weights.
    first = rollouts[0]
    with torch.no_grad():
        at_t, _ = token_logprobs(initial, *_tensors(first), temperature=temperature)
        at_1, _ = token_logprobs(initial, *_tensors(first), temperature=1.0)
    mask = first.completion_mask.bool()
    torch.testing.assert_close(first.logprobs[mask], at_t[mask], rtol=0, atol=1e-10)
    assert (first.logprobs[mask] - at_1[mask]).abs().max() > 1e-3

    # Training forward: on-policy ratios are exactly 1 only if it divides by the same 0.6.
    for r in train_records(result.history):
        assert r["grad_norm"] > 0
        assert abs(r["ratio/min"] - 1) < 1e-9 and abs(r["ratio/max"] - 1) < 1e-9, r
        assert r["kl/old_new"] < 1e-12


@pytest.mark.parametrize("source", SOURCES)
def test_overlong_penalty_reaches_the_advantages(tmp_path, monkeypatch, source):
    monkeypatch.setattr(
        trainer_module,
        "build_task",
        lambda cfg: Task("one", even_task().train, [], reward=lambda text, ex: 1.0),
    )
    cfg = cli_cfg(tmp_path, source, overlong_buffer=3, max_new_tokens=4, steps=2)
    rollouts = capture_rollouts(monkeypatch)
    rewards_seen: list[torch.Tensor] = []
    inner = steps_module.group_advantages

    def spy(rewards, group_size, **kw):
        rewards_seen.append(rewards.clone())
        return inner(rewards, group_size, **kw)

    monkeypatch.setattr(steps_module, "group_advantages", spy)
    result = trainer_module.train(cfg)
    assert len(rewards_seen) == len(rollouts) == 2
    for rollout, rewards, record in zip(
        rollouts, rewards_seen, train_records(result.history), strict=True
    ):
        lengths = rollout.completion_lengths().tolist()
        want = torch.tensor([1.0 + overlong_penalty(n, 4, 3) for n in lengths], dtype=torch.float64)
        assert torch.equal(rewards, want)
        assert record["reward/mean"] == pytest.approx(float(want.mean()), abs=1e-12)
        assert float(want.min()) < 1.0  # the penalty bit (most completions run to the cap)


def test_cli_train_logs_on_policy_ratios_at_the_configured_temperature(tmp_path):
    """The whole command, flags to metrics.jsonl: at T=0.5 with one minibatch per step, the
    logged ratios are 1 and the clip shares 0 (the training forward and the engine agree)."""
    out = tmp_path / "run"
    argv = ["train", "--preset", "smoke", "--device", "cpu", "--output-dir", str(out)]
    argv += ["--temperature", "0.5", "--dtype", "float64", "--num-minibatches", "1"]
    argv += ["--algo", "grpo", "--lr", "1e-3", "--warmup-steps", "0"]
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = train_records(rows)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert abs(r["ratio/min"] - 1) < 1e-9 and abs(r["ratio/max"] - 1) < 1e-9
        assert r["clip/fraction"] == 0
