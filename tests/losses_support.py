"""Helpers shared by test_losses.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import torch

from gspo.core.losses import policy_loss

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-12)


def padded(rows: list[list[float]], width: int | None = None, fill: float = 0.0) -> torch.Tensor:
    width = width or max(len(r) for r in rows)
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=F64)


def mask_for(lengths: list[int], width: int | None = None) -> torch.Tensor:
    width = width or max(lengths)
    return torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.bool)


def grad_of_j(name, new, old, adv, mask, **kw):
    """(J, dJ/dlogprobs, metrics)."""
    lp = new.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, lp, old, adv, mask, **kw)
    (-loss).backward()
    return -loss.item(), lp.grad, metrics


# TV5/TV6 inputs: G = 2, lengths 2 and 4.
OLD = padded([[-1.0, -2.0], [-0.5, -0.5, -0.5, -0.5]])
NEW_OFF = padded([[-0.9, -2.1], [-0.45, -0.55, -0.40, -0.50]])
MASK = mask_for([2, 4])
ADV = torch.tensor([1.0, -1.0], dtype=F64)
