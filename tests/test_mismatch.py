"""Mismatch metrics and the TIS/MIS correction wired into the trainer (gspo.backend.options)."""

from __future__ import annotations

import math

import pytest
import torch
from update_support import update_batch

from gspo.backend.options import correction_weights, mismatch_stats
from gspo.config import TrainConfig, build
from gspo.config.options_train import LossOptions
from gspo.rollout.base import GenerationRequest

TRAIN = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
ENGINE = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -0.7, -0.4]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


def _cfg(mode, level, cap=1.5, floor=None):
    return LossOptions(
        mismatch_correction=mode, mismatch_level=level, mismatch_cap=cap, mismatch_floor=floor
    )


def test_stats_hand_computed():
    s = mismatch_stats(TRAIN, ENGINE, MASK)
    assert s["mismatch/mean_abs"] == pytest.approx((0.5 + 1.0 + 0 + 0.2 + 0.1) / 5)
    assert s["mismatch/max_abs"] == pytest.approx(1.0)
    # |Σ_t| per row: |0.5 - 1| = 0.5 and |0 + 0.2 - 0.1| = 0.1
    assert s["mismatch/seq_log_ratio_abs"] == pytest.approx((0.5 + 0.1) / 2)


def test_off_gives_no_weights():
    assert correction_weights(_cfg(None, "token"), TRAIN, ENGINE, MASK) == (None, {})


def test_token_truncate_hand_computed():
    w, m = correction_weights(_cfg("truncate", "token"), TRAIN, ENGINE, MASK)
    expected = torch.tensor(
        [[1.5, math.exp(-1.0), 0.0], [1.0, math.exp(0.2), math.exp(-0.1)]], dtype=torch.float64
    )
    assert torch.allclose(w, expected)
    assert m["mismatch/corrected_fraction"] == pytest.approx(1 / 5)  # only exp(0.5) > 1.5
    assert m["mismatch/weight_mean"] == pytest.approx(float(expected.sum()) / 5)


def test_token_mask_hand_computed():
    w, m = correction_weights(_cfg("mask", "token", cap=1.25, floor=0.5), TRAIN, ENGINE, MASK)
    expected = torch.tensor(
        [[0.0, 0.0, 0.0], [1.0, math.exp(0.2), math.exp(-0.1)]], dtype=torch.float64
    )
    assert torch.allclose(w, expected)
    assert m["mismatch/corrected_fraction"] == pytest.approx(2 / 5)


@pytest.mark.parametrize(
    ("level", "rho"),
    [
        ("sequence", [math.exp(-0.5), math.exp(0.1)]),
        ("geometric", [math.exp(-0.25), math.exp(0.1 / 3)]),
    ],
)
def test_sequence_levels_hand_computed(level, rho):
    w, m = correction_weights(_cfg("truncate", level, cap=1.0), TRAIN, ENGINE, MASK)
    assert w.shape == (2,)
    assert torch.allclose(w, torch.tensor([rho[0], min(rho[1], 1.0)], dtype=torch.float64))
    assert m["mismatch/corrected_fraction"] == pytest.approx(0.5)  # row 2 is capped at 1


def _update(weights, micro=0):
    """One update_policy call on a fixed rollout with non-zero advantages; the new weights."""
    from gspo.backend.update import update_policy
    from gspo.compose.parts import build_policy_for
    from gspo.rollout import SamplingParams
    from gspo.rollout.torch_engine import TorchEngine

    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(num_minibatches=1, micro_batch_size=micro, lr=1e-2, warmup_steps=0),
    )
    model, tok = build_policy_for(cfg, torch.device("cpu"))
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "30+4=")]
    params = SamplingParams(max_new_tokens=4)
    rollout = engine.generate(
        GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(0))
    )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3])  # [N]
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    old = rollout.logprobs - 0.1 * rollout.completion_mask  # off-policy: ratios != 1
    batch = update_batch(rollout, old, adv, weights=weights(rollout))
    update_policy(cfg, model, None, opt, sched, batch)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_update_policy_applies_the_correction_weights():
    """Zero weights leave the model as it was; unit weights equal no correction; token
    weights reach the right micro-batch rows and columns (micro-batching changes nothing)."""
    plain = _update(lambda r: None)
    zero = _update(lambda r: torch.zeros(r.num_samples))
    ones = _update(lambda r: torch.ones(r.num_samples))
    zero_tokens = _update(lambda r: torch.zeros_like(r.logprobs))
    from gspo.compose.parts import build_policy_for

    model, _ = build_policy_for(build(TrainConfig, preset="smoke"), torch.device("cpu"))
    start = model.state_dict()
    for name in plain:
        assert torch.equal(zero[name], start[name]), name
        assert torch.equal(zero_tokens[name], start[name]), name
        assert torch.equal(ones[name], plain[name]), name
    assert any(not torch.equal(plain[k], start[k]) for k in plain)

    def token_weights(r):
        g = torch.Generator().manual_seed(1)
        return torch.rand(r.logprobs.shape, generator=g, dtype=torch.float64) * r.completion_mask

    whole = _update(token_weights)
    split = _update(token_weights, micro=3)
    for name in whole:
        assert torch.allclose(whole[name], split[name], atol=1e-6), name
    assert any(not torch.allclose(whole[k], plain[k], atol=1e-6) for k in plain)


def test_train_logs_the_corrected_share(tmp_path):
    """A mask window no ratio falls into zeroes every weight, and the metrics say so (a
    bfloat16 engine copy makes the mismatch real)."""
    from gspo.compose.train import train

    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(
            output_dir=str(tmp_path / "run"),
            engine_dtype="bfloat16",
            old_logprobs="recompute",
            mismatch_correction="mask",
            mismatch_level="geometric",
            mismatch_cap=1e-6,
            mismatch_floor=0.0,
        ),
    )
    record = train(cfg).history[-1]
    assert record["mismatch/corrected_fraction"] == 1.0
    assert record["mismatch/weight_mean"] == 0.0
    assert record["mismatch/max_abs"] > 0
