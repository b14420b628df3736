"""Off-policy sequence masking (OPSM, DeepSeek-V3.2, arXiv 2512.02556, Eq. 9).

A sequence with a negative advantage is dropped from the policy loss when the current policy
has already moved far away from the policy that sampled it:

    M_i = 0  if  A_i < 0  and  (1/|y_i|) Σ_t (log μ(y_{i,t}) - log π_θ(y_{i,t})) > δ,  else 1,

with μ the behaviour (sampling) policy: the rollout engine's log-probs, so the mask sees both
staleness (optimizer steps since sampling) and training-inference mismatch. The mean log-ratio
is a per-token estimate of KL(μ || π_θ) on μ's samples. The mask is detached and multiplies the
sequence's policy term (the ``weights`` of ``gspo.core.losses.policy_loss``); the KL penalty, if
any, is untouched. Positive-advantage sequences are always kept: pushing up a sample the policy
has moved away from is what learning wants, pushing down one it already avoids only adds noise.

δ. Peers differ 5000x: TRL suggests 0.5 (``off_policy_mask_threshold``), slime defaults to 1e-4
(``--use-opsm``). gspo's default is ``DEFAULT_DELTA`` = 0.5; see its docstring for why.
"""

from __future__ import annotations

import torch

DEFAULT_DELTA = 0.5
"""δ for ``off_policy_mask``. 0.5 nats per token means the current policy gives the sampled
sequence e^-0.5 ≈ 0.61 of the sampler's probability *per token* (geometric mean). This makes the
mask a safety net for stale or mismatched samples (async rollouts, a low-precision engine, the
unsynced vLLM weights of TRL #5312, whose mean ratio 0.019 is a log-ratio of -3.96) and a no-op
for ordinary minibatch staleness. Measured on the addition demo (GSPO, 4 minibatches, 3 seeds,
150 steps; docs/reproduction.md, "Off-policy sequence masking"): the largest per-sequence
mean_t log(μ/π_θ) over a whole run was 0.15-0.21 (the median of the per-step maxima 0.04-0.06),
so δ = 0.5 masked nothing and those runs are identical to unmasked ones, while slime's δ = 1e-4
masked 12-22% of all sequences (16-30% of those in the off-policy minibatches, where only the
negative-advantage ones among the 39-76% with a non-zero advantage can be masked).
At 1e-4 the mask acts like a one-sided sequence clip at a geometric-mean ratio of 1 - 1e-4 (GSPO's
own low clip is 1 - 3e-4 on the same ratio): it changes the algorithm rather than guarding it."""


def off_policy_sequence_mask(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    delta: float = DEFAULT_DELTA,
) -> torch.Tensor:
    """[B] float 0/1, detached: 0 for sequences with A_i < 0 and mean_t(log μ - log π_θ) > δ.

    ``advantages`` is [B] or [B, T] (then a sequence is negative when its token mean is, as for
    a uniform per-token advantage). Empty rows are kept (they contribute nothing anyway).
    """
    if delta < 0:
        raise ValueError(f"off-policy mask delta must be >= 0, got {delta}")
    mask = mask.bool()
    with torch.no_grad():
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        diff = torch.where(mask, behaviour_logprobs.to(logprobs.dtype) - logprobs, zero)  # [B, T]
        lengths = mask.sum(dim=1).clamp(min=1).to(logprobs.dtype)  # [B]
        mean_kl = diff.sum(dim=1) / lengths  # [B]
        if advantages.dim() == 2:
            adv = torch.where(mask, advantages.to(logprobs.dtype), zero).sum(dim=1) / lengths
        else:
            adv = advantages.to(logprobs.dtype)  # [B]
        drop = (adv < 0) & (mean_kl > delta) & mask.any(dim=1)  # [B]
        return (~drop).to(logprobs.dtype)  # [B]


def mask_metrics(keep: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``opsm/masked_fraction``: share of non-empty sequences the mask dropped."""
    nonempty = mask.bool().any(dim=1)  # [B]
    n = max(int(nonempty.sum()), 1)
    return {"opsm/masked_fraction": int(((keep == 0) & nonempty).sum()) / n}
