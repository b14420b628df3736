"""The FSDP2 backend on Ray as a whole TrainingBackend: the same log-probs, metrics, skips,
checkpoints and export as the local backend (faults: test_ray_faults.py)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from update_support import update_batch

from gspo.backend.base import CheckpointTarget, TrainingBackend
from gspo.backend.local import LocalBackend
from gspo.compose.parts import build_policy_for
from gspo.config import TrainConfig, build
from gspo.models.logprobs import token_logprobs
from gspo.rollout.base import Rollout

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

TOLERANCE = 1e-12  # float64 weights (see test_fsdp_ray.py); measured differences ~1e-16


@pytest.fixture(scope="module")
def ray_session():
    from gspo.backend.ray_cluster import start_ray, stop_ray

    ray = start_ray(None, num_cpus=2)
    yield ray
    stop_ray(ray)


def _cfg(**kw) -> TrainConfig:
    values = dict(micro_batch_size=1, device="cpu", lr=1e-3, max_grad_norm=0.5, dtype="float64")
    return build(TrainConfig, preset="smoke", overrides={**values, **kw})


def _batch(model, n: int = 6, zero_rows: tuple[int, ...] = ()):
    g = torch.Generator().manual_seed(5)
    p, length = 3, 5
    prompt_ids = torch.randint(3, 20, (n, p), generator=g)  # [N, P]
    completion_ids = torch.randint(3, 20, (n, length), generator=g)  # [N, L]
    lengths = torch.tensor([5, 3, 4, 5, 2, 5, 1, 4][:n])
    completion_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()  # [N, L]
    with torch.no_grad():
        current, _ = token_logprobs(
            model, prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask
        )
    engine = (
        current - 0.05 * torch.randn(n, length, generator=g, dtype=torch.float64)
    ) * completion_mask
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=engine,  # [N, L]
        finish_reasons=["length"] * n,
        prompt_index=torch.arange(n),
    )
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.5, -1.5][:n], dtype=torch.float64)
    advantages[list(zero_rows)] = 0.0  # [N]
    return rollout, advantages


def _weights_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize(
    "kw, zero_rows",
    [
        (dict(kl_coef=0.1, old_logprobs="recompute"), ()),  # KL in the loss, recompute pass
        (dict(), (0, 3, 4)),  # idle rows: the local split vs the ranks' all-live passes
        # Idle rows without their metrics: dropped on every rank as locally (entropy, clip and
        # ratio metrics cover the live rows only); minibatch 2 (rows 0, 3, 4) has no live row.
        (dict(zero_advantage_metrics=False), (0, 3, 4, 5)),
        (dict(kl_coef=0.1, kl_in_reward=True), ()),  # KL in the reward (on rank 0)
    ],
)
def test_ray_backend_equals_local(ray_session, kw, zero_rows):
    from gspo.backend.ray_backend import RayFSDPBackend

    cfg = _cfg(**kw)
    torch.manual_seed(0)
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    rollout, advantages = _batch(model, zero_rows=zero_rows)
    local = LocalBackend(cfg, copy.deepcopy(model), torch.device("cpu"))
    # 6 rows, 2 minibatches of 3: ranks hold 2 and 1 rows, micro-batches of 1 (padding passes).
    ray_backend = RayFSDPBackend(cfg, copy.deepcopy(model), workers=2)
    try:
        assert isinstance(ray_backend, TrainingBackend)
        old_l, mis_l = local.old_logprobs(rollout)
        old_r, mis_r = ray_backend.old_logprobs(rollout)
        assert float((old_l - old_r).abs().max()) < 1e-12
        assert mis_r.keys() == mis_l.keys()
        ref_l, ref_r = local.reference_logprobs(rollout), ray_backend.reference_logprobs(rollout)
        assert (ref_l is None) == (ref_r is None)
        if ref_l is not None:
            assert float((ref_l - ref_r).abs().max()) < 1e-12
        pen_l, kl_l = local.kl_penalty(rollout, old_l)
        pen_r, kl_r = ray_backend.kl_penalty(rollout, old_l)
        assert (pen_l is None) == (pen_r is None) and kl_r == pytest.approx(kl_l, rel=1e-12)
        if pen_l is not None:
            assert float((pen_l - pen_r).abs().max()) < 1e-12
        m_l = local.update(update_batch(rollout, old_l, advantages, 0))
        m_r = ray_backend.update(update_batch(rollout, old_l, advantages, 0))
        diff = _weights_diff(local.model.state_dict(), ray_backend.full_state_dict())
        print(f"{kw} zero rows {zero_rows}: weights 2 ranks vs local {diff:.1e}")
        assert diff < TOLERANCE
        # Every metric pooled over both ranks as one process pools it (not rank 0's share).
        assert m_r.keys() == m_l.keys()
        for key in m_l:
            assert m_r[key] == pytest.approx(m_l[key], rel=1e-9, abs=1e-12), key
        assert ray_backend.lr() == pytest.approx(local.lr())
    finally:
        ray_backend.close()


def test_non_finite_on_one_rank_skips_everywhere(ray_session):
    from gspo.backend.ray_backend import RayFSDPBackend

    cfg = _cfg(num_minibatches=1)
    torch.manual_seed(0)
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    rollout, advantages = _batch(model)
    advantages[1] = float("nan")  # row 1: rank 1's share only
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backend = RayFSDPBackend(cfg, model, workers=2)
    try:
        metrics = backend.update(update_batch(rollout, rollout.logprobs, advantages, 0))
        assert metrics["faults/skipped_updates"] == 1.0
        assert _weights_diff(before, backend.full_state_dict()) == 0.0  # no rank stepped
    finally:
        backend.close()


def test_checkpoint_resume_and_export(ray_session, tmp_path):
    from gspo.backend.ray_backend import RayFSDPBackend

    cfg = _cfg(warmup_steps=3)
    torch.manual_seed(0)
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    rollout, advantages = _batch(model)
    first = RayFSDPBackend(cfg, copy.deepcopy(model), workers=2)
    try:
        first.update(update_batch(rollout, rollout.logprobs, advantages, 0))
        path = first.save_checkpoint(
            CheckpointTarget(tmp_path, tokenizer, {}, 2), 1, {"bad_streak": 0}
        )
        m_unbroken = first.update(update_batch(rollout, rollout.logprobs, advantages, 1))
        unbroken = first.full_state_dict()
        lr_unbroken = first.lr()
        first.export(tmp_path / "final", tokenizer)
    finally:
        first.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]
    second = RayFSDPBackend(cfg, copy.deepcopy(model), workers=2)
    try:
        state = second.load_checkpoint(path)
        assert state["step"] == 1 and state["bad_streak"] == 0
        m_resumed = second.update(update_batch(rollout, rollout.logprobs, advantages, 1))
        assert _weights_diff(unbroken, second.full_state_dict()) == 0.0  # optimizer moments too
        assert m_resumed == m_unbroken and second.lr() == lr_unbroken  # the schedule too
    finally:
        second.close()
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "final", torch_dtype=torch.float64)
    assert _weights_diff(unbroken, exported.state_dict()) == 0.0


def test_activation_checkpointing_same_update_and_bf16_close(ray_session):
    """Activation checkpointing recomputes the same numbers (float64: equal to local); bf16
    compute with fp32 reduction stays near the float32 update (its rounding, ~1e-2 rel)."""
    from gspo.backend.ray_backend import RayFSDPBackend

    cfg = _cfg(backend="ray", activation_checkpointing=True)
    torch.manual_seed(0)
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    rollout, advantages = _batch(model)
    local = LocalBackend(cfg, copy.deepcopy(model), torch.device("cpu"))
    local.update(update_batch(rollout, rollout.logprobs, advantages, 0))
    backend = RayFSDPBackend(cfg, copy.deepcopy(model), workers=2)
    try:
        backend.update(update_batch(rollout, rollout.logprobs, advantages, 0))
        diff = _weights_diff(local.model.state_dict(), backend.full_state_dict())
    finally:
        backend.close()
    print(f"activation checkpointing: weights vs local {diff:.1e}")
    assert diff < TOLERANCE

    cfg32 = _cfg(dtype="float32", backend="ray", fsdp_param_dtype="bfloat16")
    torch.manual_seed(0)
    model, _ = build_policy_for(cfg32, torch.device("cpu"))
    rollout, advantages = _batch(model.double())
    model.float()
    rollout.logprobs = rollout.logprobs.float()
    local = LocalBackend(cfg32, copy.deepcopy(model), torch.device("cpu"))
    m_local = local.update(update_batch(rollout, rollout.logprobs, advantages.float(), 0))
    backend = RayFSDPBackend(cfg32, copy.deepcopy(model), workers=2)
    try:
        m_bf16 = backend.update(update_batch(rollout, rollout.logprobs, advantages.float(), 0))
        state = backend.full_state_dict()
    finally:
        backend.close()
    assert all(v.dtype == torch.float32 for v in state.values())  # master weights stay fp32
    rel = abs(m_bf16["grad_norm"] - m_local["grad_norm"]) / m_local["grad_norm"]
    print(f"bf16 compute: grad norm {m_bf16['grad_norm']:.4f} vs fp32 {m_local['grad_norm']:.4f}")
    assert 0 < rel < 0.05
