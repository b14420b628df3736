"""The off-policy sequence mask with ``old_logprobs='recompute'``: the one setting where the
mask's behaviour log-probs (the engine's, μ) and the loss's old ones (a recompute pass of the
current weights) differ. The mask must compare π_θ with μ, not with the recomputed old
log-probs: right after a recompute those equal π_θ, so a mask fed the old ones drops nothing.
"""

from __future__ import annotations

import copy

import pytest
import torch
from update_support import update_batch

from gspo.backend.local import LocalBackend
from gspo.config import TrainConfig, build
from gspo.models.logprobs import token_logprobs
from gspo.models.policy import build_policy
from gspo.rollout.base import Rollout

# Per row: the advantage and the engine's per-token log-prob offset from the current policy,
# i.e. mean_t(log μ - log π_θ). δ = 0.5 drops rows 0 and 5 only (A < 0 and offset > δ); row 2
# is far off too but has A > 0, row 3 is off the other way, row 4 is within δ.
ADVANTAGES = [-1.0, -1.0, 1.0, -0.5, -2.0, -1.5]
ENGINE_OFFSET = [1.0, 0.0, 1.0, -1.0, 0.3, 0.8]
DROPPED = [0, 5]
DELTA = 0.5


def _cfg(**kw) -> TrainConfig:
    values = dict(
        device="cpu", dtype="float64", lr=1e-3, warmup_steps=0, num_minibatches=1,
        micro_batch_size=2, old_logprobs="recompute", off_policy_mask=True,
        off_policy_mask_delta=DELTA,
    )  # fmt: skip
    return build(TrainConfig, preset="smoke", overrides={**values, **kw})


def _rollout(model) -> Rollout:
    """Six rows whose engine log-probs sit ENGINE_OFFSET nats per token above the policy's."""
    g = torch.Generator().manual_seed(3)
    n, p, length = len(ADVANTAGES), 3, 5
    prompt_ids = torch.randint(3, 20, (n, p), generator=g)  # [N, P]
    completion_ids = torch.randint(3, 20, (n, length), generator=g)  # [N, L]
    lengths = torch.tensor([5, 3, 4, 5, 2, 5])
    completion_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()  # [N, L]
    with torch.no_grad():
        current, _ = token_logprobs(
            model, prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask
        )  # [N, L]
    offset = torch.tensor(ENGINE_OFFSET, dtype=torch.float64)[:, None]  # [N, 1]
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=(current + offset) * completion_mask,  # [N, L] μ, 0 on padding
        finish_reasons=["length"] * n,
        prompt_index=torch.arange(n),
    )


def _update(cfg: TrainConfig, model, rollout: Rollout, advantages: torch.Tensor):
    """One step as the loop runs it: the backend's old log-probs, then its update."""
    backend = LocalBackend(cfg, copy.deepcopy(model), torch.device("cpu"))
    old, mismatch = backend.old_logprobs(rollout)  # [N, L]
    metrics = backend.update(update_batch(rollout, old, advantages))
    return old, mismatch, metrics, backend.model.state_dict()


@pytest.fixture(scope="module")
def policy():
    cfg = _cfg()
    torch.manual_seed(0)
    model, _ = build_policy(cfg.model, torch.device("cpu"), seed=cfg.run.seed)
    return cfg, model, _rollout(model)


def test_the_mask_compares_with_the_engine_not_the_recomputed_old_logprobs(policy):
    cfg, model, rollout = policy
    advantages = torch.tensor(ADVANTAGES, dtype=torch.float64)  # [N]
    old, mismatch, metrics, weights = _update(cfg, model, rollout, advantages)
    mask = rollout.completion_mask.bool()
    # The two candidates differ: old is the current policy (so old vs π_θ is ~0 per token),
    # the engine sits ENGINE_OFFSET above it.
    gap = ((rollout.logprobs - old) * mask).sum(dim=1) / mask.sum(dim=1)  # [N]
    assert gap.tolist() == pytest.approx(ENGINE_OFFSET, abs=1e-12)
    assert mismatch  # the recompute pass ran (its mismatch/* metrics against the engine)
    # Rows 0 and 5 dropped: the metric is pooled over micro-batches by their tokens.
    assert metrics["opsm/masked_fraction"] == pytest.approx(_expected_fraction(rollout), rel=1e-12)
    # The gradient: exactly that of the same update with the dropped rows' advantage 0 and no
    # mask (a dropped row contributes 0 to the loss either way; its length still counts).
    # zero_advantage_split=1: the zeroed rows stay in the same micro-batches (same sums).
    zeroed = advantages.clone()
    zeroed[DROPPED] = 0.0
    plain = _cfg(off_policy_mask=False, zero_advantage_split=1.0)
    *_, expected = _update(plain, model, rollout, zeroed)
    start = model.state_dict()
    moved = max(float((expected[k] - start[k]).abs().max()) for k in start)
    diff = max(float((expected[k] - weights[k]).abs().max()) for k in start)
    assert moved > 1e-4 and diff < 1e-15, (moved, diff)
    # And not the update that keeps them (what a mask fed the old log-probs would do).
    *_, unmasked = _update(_cfg(off_policy_mask=False), model, rollout, advantages)
    assert max(float((unmasked[k] - weights[k]).abs().max()) for k in start) > 1e-6


def _expected_fraction(rollout: Rollout) -> float:
    """opsm/masked_fraction as the update pools it: each micro-batch's share of dropped
    sequences, weighted by its tokens (one minibatch, rows in the order the update takes)."""
    from gspo.backend.update import minibatch_rows
    from gspo.core.seeding import step_generator

    cfg = _cfg()
    gen = step_generator(cfg.run.seed, 0, stream=1, device=torch.device("cpu"))
    (rows,) = minibatch_rows(
        rollout.num_samples, cfg.rollout.group_size, 1, cfg.optim.minibatch_grouping, gen
    )
    tokens = rollout.completion_mask.sum(dim=1)  # [N]
    total = weighted = 0.0
    for part in rows.split(cfg.optim.micro_batch_size):
        share = sum(int(r) in DROPPED for r in part) / len(part)
        weighted += share * float(tokens[part].sum())
        total += float(tokens[part].sum())
    return weighted / total
