"""FSDP2 ranks in Ray actors: 2 gloo ranks give the same first update as one process."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from update_support import update_batch

import gspo.backend.update as update_module
from gspo.compose.parts import build_policy_for
from gspo.config import TrainConfig, build
from gspo.core.losses import LOSSES
from gspo.models.logprobs import token_logprobs
from gspo.rollout.base import Rollout

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

# AdamW's first steps move a weight by lr * m / (sqrt(v) + eps) ~ lr * sign(g) when |g| >> eps,
# whatever the gradient's scale: with ordinary advantages, a planted bug that multiplied every
# rank's loss by the rank count (twice the true gradient) moved the final weights by 6.8e-11
# only. The advantages are therefore scaled so that the whole gradient's norm is below 1e-10, far
# under AdamW's eps = 1e-8, where the step is lr * g / eps: linear in g, so a wrong gradient is a
# proportionally wrong update. lr = 1 makes that update ~4e-4 (gspo), and the test compares the updates
# (weights after - before) in float64, relative to the largest one. Measured for gspo: 4.4e-15
# honestly; 1.0 with that planted bug, 0.50 with FSDP2 averaging the ranks' gradients (no divide
# factor 1), 0.28 with rank 1 doubling one micro-batch's loss.
ADVANTAGE_SCALE = 1e-11
ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which both backends use
REL_TOLERANCE = 1e-9


@pytest.fixture(scope="module")
def ray_session():
    from gspo.backend.ray_cluster import start_ray, stop_ray

    ray = start_ray(None, num_cpus=2)
    yield ray
    stop_ray(ray)


def _cfg(algo: str) -> TrainConfig:
    return build(
        TrainConfig,
        preset="smoke",
        overrides=dict(
            algo=algo,
            micro_batch_size=2,
            device="cpu",
            lr=1.0,
            warmup_steps=0,
            max_grad_norm=0.5,
            dtype="float64",
        ),
    )


def _batch(cfg: TrainConfig, model):
    g = torch.Generator().manual_seed(5)
    n, p, length = 8, 3, 5
    prompt_ids = torch.randint(3, 20, (n, p), generator=g)  # [N, P]
    completion_ids = torch.randint(3, 20, (n, length), generator=g)  # [N, L]
    lengths = torch.tensor([5, 3, 4, 5, 2, 5, 1, 4])
    completion_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()  # [N, L]
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
            model, prompt_ids, rollout.prompt_mask, completion_ids, completion_mask
        )  # [N, L]
    old = (
        current - 0.1 * torch.randn(n, length, generator=g, dtype=torch.float64)
    ) * completion_mask  # [N, L]
    advantages = ADVANTAGE_SCALE * torch.tensor(
        [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.5, -1.5], dtype=torch.float64
    )  # [N]
    return rollout, old, advantages


@pytest.mark.parametrize("algo", sorted(LOSSES))
def test_two_ranks_equal_one_process(ray_session, algo):
    from gspo.backend.ray_backend import RayFSDPBackend

    cfg = _cfg(algo)
    torch.manual_seed(0)
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    rollout, old, advantages = _batch(cfg, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    local = copy.deepcopy(model)
    opt = torch.optim.AdamW(
        local.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, update_module.lr_lambda(cfg.optim.warmup_steps))
    local_metrics = update_module.update_policy(
        cfg, local, None, opt, sched, update_batch(rollout, old, advantages)
    )

    backend = RayFSDPBackend(cfg, model, workers=2)
    try:
        metrics = backend.update(update_batch(rollout, old, advantages, 0))
        sharded = backend.full_state_dict()
    finally:
        backend.close()
    # The linear regime: every |g| <= the gradient's norm, far below eps.
    assert local_metrics["grad_norm"] < 1e-2 * ADAM_EPS
    expected = {k: v - before[k] for k, v in local.state_dict().items()}  # the update
    got = {k: sharded[k] - before[k] for k in expected}
    moved = max(float(v.abs().max()) for v in expected.values())
    assert moved > 1e-4  # the update did something
    diff = max(float((expected[k] - got[k]).abs().max()) for k in expected) / moved
    print(f"{algo}: largest update {moved:.2e}, 2 ranks vs 1 process differ by {diff:.2e} of it")
    assert diff < REL_TOLERANCE
    # Clipping saw the global norm, not one rank's.
    assert metrics["grad_norm"] == pytest.approx(local_metrics["grad_norm"], rel=1e-12)
