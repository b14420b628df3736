"""MoE metrics: routing change between two records, expert load, and the load-balancing
auxiliary loss, all over the scored response positions (:func:`scored_positions`)."""

from __future__ import annotations

import sys

import torch
from torch import nn

from .moe_routing import Routing, RoutingCapture, moe_routers

# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def scored_positions(prompt_len: int, completion_mask: torch.Tensor) -> torch.Tensor:
    """Mask [N, P+L] of the positions whose output scores a completion token.

    Completion token j (mask 1) is predicted at position P-1+j, so those are the positions whose
    experts decide each response token's likelihood; prompt and padding positions are 0.
    """
    n, length = completion_mask.shape
    out = torch.zeros((n, prompt_len + length), dtype=torch.bool, device=completion_mask.device)
    out[:, prompt_len - 1 : prompt_len - 1 + length] = completion_mask.bool()
    return out  # [N, P+L]


def routing_change(a: Routing, b: Routing, positions: torch.Tensor) -> dict[str, float]:
    """How much routing ``b`` differs from ``a`` over ``positions`` [N, T] (both recorded there).

    - ``change``: the share of (position, layer, top-k slot) selections of ``b`` whose expert is
      not among the k experts ``a`` chose for that position and layer, i.e.
      Σ |E_b \\ E_a| / (k · #positions · #layers). Top-k experts are distinct, so this equals the
      share of "experts activated under b that differ from those under a" (the GSPO paper's
      ~10%); it is symmetric in a and b.
    - ``any``: the share of (position, layer) pairs whose expert *set* differs at all.
    - ``token``: the share of positions that differ in at least one layer.

    Positions where either record is -1 are left out. All three are 0 when nothing is left.
    """
    ia, ib = a.indices, b.indices.to(a.indices.device)  # [R, N, T, k]
    if ia.shape != ib.shape:
        raise ValueError(f"routing shapes differ: {tuple(ia.shape)} vs {tuple(ib.shape)}")
    valid = positions.to(ia.device).bool().unsqueeze(0)  # [1, N, T]
    valid = valid & (ia >= 0).all(-1) & (ib >= 0).all(-1)  # [R, N, T]
    missing = (ib.unsqueeze(-1) != ia.unsqueeze(-2)).all(-1)  # [R, N, T, k] slot of b not in a
    slots_changed = missing.sum(-1)  # [R, N, T]
    n_pairs = int(valid.sum())
    if n_pairs == 0:
        return {"change": 0.0, "any": 0.0, "token": 0.0}
    k = ia.shape[-1]
    changed = (slots_changed > 0) & valid  # [R, N, T]
    token_valid = valid.all(0)  # [N, T] valid in every layer
    n_tokens = int(token_valid.sum())
    return {
        "change": float(slots_changed[valid].sum()) / (k * n_pairs),
        "any": float(changed.sum()) / n_pairs,
        "token": float((changed.any(0) & token_valid).sum()) / max(n_tokens, 1),
    }


def load_stats(routing: Routing, positions: torch.Tensor) -> dict[str, float]:
    """Expert load over ``positions`` [N, T]: per layer, share_e = selections of expert e /
    (k · #positions), so the shares sum to 1. ``max_share`` is 1/E when balanced and 1/k at
    worst (the same k experts for every token); ``cv`` is std / mean of the shares over experts
    (population std; 0 when balanced). Both are averaged over layers."""
    idx = routing.indices  # [R, N, T, k]
    mask = positions.to(idx.device).bool()  # [N, T]
    e = routing.num_experts
    max_share, cv = [], []
    for layer in idx:  # [N, T, k]
        chosen = layer[mask]  # [n, k]
        chosen = chosen[(chosen >= 0).all(-1)]
        if chosen.numel() == 0:
            continue
        counts = torch.bincount(chosen.reshape(-1), minlength=e).double()  # [E]
        share = counts / counts.sum()  # [E]
        max_share.append(float(share.max()))
        cv.append(float(share.std(correction=0) / share.mean()))
    if not max_share:
        return {"max_share": 0.0, "cv": 0.0}
    return {"max_share": sum(max_share) / len(max_share), "cv": sum(cv) / len(cv)}


def _load_balancing_fn(model: nn.Module):
    """transformers' own ``load_balancing_loss_func`` from the model's modeling module (the
    function ``model(..., output_router_logits=True)`` uses for ``aux_loss``)."""
    module = sys.modules.get(type(model).__module__)
    fn = getattr(module, "load_balancing_loss_func", None)
    if fn is None:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        fn = load_balancing_loss_func
    return fn


def aux_loss(
    model: nn.Module, rec: RoutingCapture, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """The Switch-Transformer load-balancing loss of the captured router logits (differentiable).

    E · Σ_e f_e · P_e over non-padding tokens, with f_e the share of top-k assignments to expert
    e (from the router's own top-k, also under replay) and P_e its mean router probability;
    it equals ``model(..., output_router_logits=True).aux_loss`` for the same forward and is
    ``top_k`` for perfectly balanced routing. Needs a capture made with ``keep_logits=True``
    of one forward over ``attention_mask``'s [N, T] tokens.
    """
    if not rec.keep_logits or not rec.logits[0]:
        raise ValueError("aux_loss needs capture_routing(..., keep_logits=True) around a forward")
    if any(len(calls) != 1 for calls in rec.logits):
        raise ValueError("aux_loss expects exactly one forward call per layer")
    logits = tuple(calls[0] for calls in rec.logits)  # R x [N*T, E]
    router = moe_routers(model)[0]
    return _load_balancing_fn(model)(logits, router.num_experts, router.top_k, attention_mask)
