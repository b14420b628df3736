"""Group-normalized advantages: each response is scored against the other responses to its prompt."""

from __future__ import annotations

import torch

from gspo.config.names import ADVANTAGE_SCALES as SCALES


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale: str = "std", eps: float = 1e-6
) -> torch.Tensor:
    """A_i = (r_i - mean_g(r)) / (std_g(r) + eps) within each group of ``group_size`` responses.

    ``rewards`` is [B] laid out group after group (B = n_groups * group_size). ``scale``:

    * ``"std"`` (default): the *population* standard deviation (divide by G), so rewards
      [1, 0, 0, 1] give exactly ±1 up to eps;
    * ``"sample_std"``: the Bessel-corrected sample std (divide by G - 1, as ``torch.std`` and
      TRL do): [1, 0, 0, 1] gives ±0.866;
    * ``"none"``: Dr. GRPO's r - mean, no division.

    A group whose rewards are all equal gets exactly 0 (never NaN), whatever the scale: the
    centred rewards are exactly 0 there. A group of size 1 also gets 0 (no baseline to compare
    with). Advantages sum to 0 within each group up to rounding.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(SCALES)}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(f"{rewards.shape[0]} rewards cannot be split into groups of {group_size}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards must be finite (got inf or NaN)")
    groups = rewards.view(-1, group_size)  # [n_groups, G]
    centred = groups - groups.mean(dim=1, keepdim=True)  # [n_groups, G]
    # Equal rewards can leave a rounding residue after mean subtraction; make those groups exact 0.
    equal = (groups == groups[:, :1]).all(dim=1, keepdim=True)  # [n_groups, 1]
    centred = torch.where(equal, torch.zeros_like(centred), centred)
    if scale == "none" or group_size == 1:
        return centred.reshape(-1)  # [B]
    std = groups.std(dim=1, keepdim=True, correction=1 if scale == "sample_std" else 0)
    # Equal groups divide 0 by 1, not by a rounding-noise std (0/0 = NaN when eps is 0).
    std = torch.where(equal, torch.ones_like(std), std)  # [n_groups, 1]
    return (centred / (std + eps)).reshape(-1)  # [B]


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence advantages [B] copied onto each response token: [B, T], 0 off the mask."""
    return advantages[:, None] * mask.to(advantages.dtype)  # [B, T]
