"""Resuming with another layout: a checkpoint of 2 FSDP2 ranks resumes on 1 rank and in the
local backend, one of 1 rank on 2, and a local checkpoint on 2 ranks; each continues as the
unbroken run (weights right after loading bit for bit, the next update within float64
rounding: the ranks sum gradients in another order)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from update_support import update_batch

from gspo.backend.base import CheckpointTarget
from gspo.backend.local import LocalBackend
from gspo.compose.parts import build_policy_for
from gspo.config import TrainConfig, build
from gspo.models.logprobs import token_logprobs
from gspo.rollout.base import Rollout

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

WEIGHT_TOL = 1e-12  # float64; measured differences ~1e-16 (printed)
METRIC_REL = 1e-9


@pytest.fixture(scope="module")
def ray_session():
    from gspo.backend.ray_cluster import start_ray, stop_ray

    ray = start_ray(None, num_cpus=2)
    yield ray
    stop_ray(ray)


def _cfg() -> TrainConfig:
    values = dict(
        micro_batch_size=1, device="cpu", lr=1e-3, dtype="float64", warmup_steps=3, threads=1
    )
    return build(TrainConfig, preset="smoke", overrides=values)


def _batch(model, n: int = 6) -> tuple[Rollout, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    prompt_ids = torch.randint(3, 20, (n, 3), generator=g)  # [N, P]
    completion_ids = torch.randint(3, 20, (n, 5), generator=g)  # [N, L]
    lengths = torch.tensor([5, 3, 4, 5, 2, 5])
    completion_mask = (torch.arange(5)[None, :] < lengths[:, None]).long()  # [N, L]
    with torch.no_grad():
        current, _ = token_logprobs(
            model, prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask
        )  # [N, L]
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=current * completion_mask,  # [N, L]
        finish_reasons=["length"] * n,
        prompt_index=torch.arange(n),
    )
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], dtype=torch.float64)  # [N]
    return rollout, advantages


def _diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _weights(backend) -> dict[str, torch.Tensor]:
    full = getattr(backend, "full_state_dict", None)
    return full() if full is not None else backend.model.state_dict()


def _continues(backend, path, saved, unbroken, metrics, lr, batch, what: str) -> None:
    """``backend`` loads ``path`` (weights equal ``saved`` exactly), updates step 1 once and
    ends where the unbroken run did."""
    state = backend.load_checkpoint(path)
    assert state["step"] == 1
    assert _diff(saved, _weights(backend)) == 0.0, what
    m = backend.update(update_batch(batch[0], batch[0].logprobs, batch[1], 1))
    diff = _diff(unbroken, _weights(backend))
    print(f"{what}: weights vs unbroken {diff:.1e}")
    assert diff < WEIGHT_TOL, what  # Adam's moments were restored: a fresh Adam moves ~lr
    assert backend.lr() == pytest.approx(lr, rel=1e-15), what
    assert m.keys() == metrics.keys()
    for key in metrics:
        assert m[key] == pytest.approx(metrics[key], rel=METRIC_REL, abs=1e-12), (what, key)


def _run_two(backend, batch, out, tokenizer):
    """Update step 0, checkpoint, update step 1: (path, saved weights, final, metrics, lr)."""
    backend.update(update_batch(batch[0], batch[0].logprobs, batch[1], 0))
    path = backend.save_checkpoint(CheckpointTarget(out, tokenizer, {}, 2), 1, {})
    saved = {k: v.clone() for k, v in _weights(backend).items()}
    metrics = backend.update(update_batch(batch[0], batch[0].logprobs, batch[1], 1))
    return path, saved, _weights(backend), metrics, backend.lr()


def test_resume_with_other_rank_counts_and_backends(ray_session, tmp_path):
    from gspo.backend.ray_backend import RayFSDPBackend

    cfg = _cfg()
    torch.manual_seed(0)
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    batch = _batch(model)

    def ray(n: int) -> RayFSDPBackend:
        return RayFSDPBackend(cfg, copy.deepcopy(model), workers=n)

    def local() -> LocalBackend:
        return LocalBackend(cfg, copy.deepcopy(model), torch.device("cpu"))

    two = ray(2)
    try:
        path2, saved, unbroken, metrics, lr = _run_two(two, batch, tmp_path / "two", tokenizer)
    finally:
        two.close()
    assert (path2 / "dcp").is_dir()
    one = ray(1)
    try:  # 2 ranks -> 1, then that rank's own checkpoint -> 2 ranks
        state = one.load_checkpoint(path2)
        path1 = one.save_checkpoint(CheckpointTarget(tmp_path / "one", tokenizer, {}, 2), 1, {})
        one.close()
        one = ray(1)
        _continues(one, path2, saved, unbroken, metrics, lr, batch, "2 ranks -> 1 rank")
    finally:
        one.close()
    assert state["step"] == 1
    again = ray(2)
    try:
        _continues(again, path1, saved, unbroken, metrics, lr, batch, "1 rank -> 2 ranks")
    finally:
        again.close()
    _continues(local(), path2, saved, unbroken, metrics, lr, batch, "2 ranks -> local")

    # A local checkpoint continued by 2 ranks.
    path_l, saved_l, unbroken_l, metrics_l, lr_l = _run_two(
        local(), batch, tmp_path / "local", tokenizer
    )
    assert (path_l / "optimizer.pt").is_file()
    onto = ray(2)
    try:
        _continues(onto, path_l, saved_l, unbroken_l, metrics_l, lr_l, batch, "local -> 2 ranks")
    finally:
        onto.close()
    assert not list((tmp_path / "local" / "checkpoints").glob(".tmp-*"))  # conversion removed
