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
from pathlib import Path

import pytest
import torch

import gspo.backend.update as update_module
import gspo.compose.train as trainer_module
import gspo.models.moe as moe_module
import gspo.orchestration.steps as steps_module
from gspo.compose.parts import build_policy_for
from gspo.config import ConfigError, TrainConfig, build
from gspo.config.combinations import split
from gspo.core.losses import LOSSES, policy_loss
from gspo.envs.rewards import overlong_penalty
from gspo.envs.tasks.base import Example, Task
from gspo.interface import cli
from gspo.models import token_logprobs
from gspo.rollout.base import Rollout

SOURCES = ("flags", "file")


def even_share(text: str, example: Example) -> float:
    """Varied rewards under a random model: the share of characters with an even code point."""
    return sum(ord(c) % 2 == 0 for c in text) / len(text) if text else 0.0


def even_task() -> Task:
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    return Task("even", train=examples[:12], test=examples[12:], reward=even_share)


@pytest.fixture(autouse=True)
def _even_task(monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: even_task())


def cli_cfg(tmp_path: Path, source: str, **values) -> TrainConfig:
    """The TrainConfig ``gspo train --preset smoke ...`` builds, with ``values`` given as flags
    or in a JSON config file."""
    argv = ["train", "--preset", "smoke", "--device", "cpu", "--threads", "0"]
    argv += ["--output-dir", str(tmp_path / "run")]
    if source == "flags":
        for key, value in values.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
    else:
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / "config.json"
        path.write_text(json.dumps(values))
        argv += ["--config", str(path)]
    args = cli._parser().parse_args(argv)
    return build(
        TrainConfig,
        preset=args.preset,
        file=args.config,
        overrides=cli._overrides(args, TrainConfig),
    )


def train_records(history: list[dict]) -> list[dict]:
    return [r for r in history if "reward/mean" in r]


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
    that put each row's ratio at POS/NEG_RATIOS under ``model`` at ``cfg.temperature``."""
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
            temperature=cfg.temperature,
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
        split(cfg), model, ref_model, optimizer, scheduler, rollout, old, advantages, step=0
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
    assert (cfg.clip_low, cfg.clip_high) == (clip_low, clip_high)
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
        cfg.algo,
        current,
        old,
        advantages,
        mask,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        constant=cfg.loss_constant or float(cfg.max_new_tokens),
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
        ref_lp, _ = token_logprobs(ref, *_tensors(rollout), temperature=cfg.temperature)
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
    inner = moe_module.generate_with_routing

    def spy(engine, prompts, n, params, generator=None):
        rollout = inner(engine, prompts, n, params, generator)
        seen.append(rollout)
        return rollout

    monkeypatch.setattr(moe_module, "generate_with_routing", spy)
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


def count_training_forwards(monkeypatch) -> list[torch.Tensor]:
    """prompt_index of every training forward with gradient (a pass-through spy)."""
    seen: list[torch.Tensor] = []
    inner = update_module.token_logprobs

    def spy(model, *args, prompt_index=None, **kw):
        if torch.is_grad_enabled():
            seen.append(prompt_index.clone())
        return inner(model, *args, prompt_index=prompt_index, **kw)

    monkeypatch.setattr(update_module, "token_logprobs", spy)
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
        "prompts_per_step": cfg.prompts_per_step,
        "group_size": cfg.group_size,
        "num_minibatches": cfg.num_minibatches,
        "steps": cfg.steps,
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
    assert [len(f) for f in forwards] == [3, 1] * (cfg.steps * cfg.num_minibatches)


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
