"""Credit assignment for episodes: one advantage per episode, or one per policy turn.

``episode`` (every algorithm): the episode's return R_i = Σ_k r_{i,k} + final reward is
group-normalized as in the single-turn case (:func:`gspo.core.losses.group_advantages`).

``turn`` (``gspo_token`` and ``grpo`` only, the losses that take [B, T] advantages): turn k of
episode i gets its discounted return-to-go G_{i,k} = Σ_{k'≥k} γ^{k'-k} r'_{i,k'} (r' = turn
rewards with the final reward added to the last turn), compared with the group's episode
returns: A_{i,k} = (G_{i,k} - mean_g G_{·,1}) / (std_g G_{·,1} + eps), copied onto the policy
tokens of turn k (0 on environment tokens). With γ = 1 and no turn rewards every turn gets the
episode's advantage, so ``turn`` then equals ``episode`` exactly. Sequence-level losses
(``gspo``, ``luspo``) take one advantage per sequence and are refused with ``turn``.
"""

from __future__ import annotations

import torch

from gspo.config.names import CREDITS
from gspo.core.losses import SCALES, get_loss, group_advantages


def credit_problem(algo: str, credit: str) -> str | None:
    """Why ``credit`` cannot work with ``algo``, or None when the pairing is fine."""
    if credit not in CREDITS:
        return f"credit must be one of {', '.join(CREDITS)}, got {credit!r}"
    if credit == "turn" and not get_loss(algo).token_advantages:
        return (
            f"credit='turn' gives each turn its own advantage, which needs a token-level loss "
            f"('gspo_token' or 'grpo'); algo={algo!r} takes one advantage per sequence "
            "(use credit='episode' with it)"
        )
    return None


def check_credit(algo: str, credit: str) -> None:
    """Refuse credit/algorithm pairings that cannot work, before any work starts."""
    problem = credit_problem(algo, credit)
    if problem is not None:
        raise ValueError(problem)


def returns_to_go(turn_rewards: list[float], final: float, gamma: float) -> list[float]:
    """G_k = Σ_{k'≥k} γ^{k'-k} r'_{k'} with the final reward added to the last turn."""
    r = list(turn_rewards)
    if not r:
        return []
    r[-1] += final
    out = [0.0] * len(r)
    acc = 0.0
    for k in range(len(r) - 1, -1, -1):
        acc = r[k] + gamma * acc
        out[k] = acc
    return out


def turn_advantages(
    turn_rewards: list[list[float]],
    final_rewards: list[float],
    turn_ids: torch.Tensor,
    group_size: int,
    *,
    gamma: float = 1.0,
    scale: str = "std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """[N, L] per-token advantages from per-turn returns (see the module doc).

    ``turn_ids`` [N, L]: the policy turn of each token, -1 on environment tokens and padding.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(SCALES)}")
    n = len(final_rewards)
    gs = [returns_to_go(r, f, gamma) for r, f in zip(turn_rewards, final_rewards, strict=True)]
    first = torch.tensor(
        [g[0] if g else f for g, f in zip(gs, final_rewards, strict=True)], dtype=torch.float64
    )
    groups = first.view(-1, group_size)  # [n_groups, G]
    mean = groups.mean(dim=1, keepdim=True).expand_as(groups).reshape(-1)  # [N]
    if scale == "none" or group_size == 1:
        std = torch.ones(n, dtype=torch.float64)  # [N]
    else:
        sd = groups.std(dim=1, keepdim=True, correction=1 if scale == "sample_std" else 0)
        equal = (groups == groups[:, :1]).all(dim=1, keepdim=True)  # [n_groups, 1]
        sd = torch.where(equal, torch.ones_like(sd), sd)  # as group_advantages: no 0/eps
        std = (sd + eps).expand_as(groups).reshape(-1)  # [N]
    if group_size == 1:
        mean = first.clone()  # no baseline: 0 as in group_advantages
    out = torch.zeros(turn_ids.shape, dtype=torch.float64)  # [N, L]
    for i, g in enumerate(gs):
        for k, value in enumerate(g):
            out[i][turn_ids[i] == k] = (value - float(mean[i])) / float(std[i])
    return out  # [N, L]


def episode_advantages(
    turn_rewards: list[list[float]], final_rewards: list[float], group_size: int, scale: str
) -> torch.Tensor:
    """[N] group-normalized episode returns (undiscounted sum of turn and final rewards)."""
    returns = torch.tensor(
        [sum(r) + f for r, f in zip(turn_rewards, final_rewards, strict=True)], dtype=torch.float64
    )
    return group_advantages(returns, group_size, scale=scale)  # [N]
