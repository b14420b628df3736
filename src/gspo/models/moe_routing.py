"""MoE routing records: finding the routers, capturing the experts each token position was
routed to, and replaying a record in a later forward (Routing Replay R2/R3).

Hooks, not module surgery: a forward hook on each router module (``Qwen3MoeTopKRouter``,
``Qwen2MoeTopKRouter`` in transformers 5.x, which return ``(router_logits, top_k_weights,
top_k_index)``) reads and, for replay, replaces its output. State-dict keys, checkpoints and the
experts kernel are untouched, and hooks exist only inside the ``with`` block. The layout of a
:class:`Routing` is described in :mod:`gspo.models.moe`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ROUTER_CLASS_SUFFIX = "TopKRouter"
"""Router modules are found by class name (``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``, and
the same-shaped routers of other transformers 5.x MoE models) plus the attributes they need."""


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's router modules in forward (layer) order; empty for a dense model."""
    return [
        m
        for m in model.modules()
        if type(m).__name__.endswith(ROUTER_CLASS_SUFFIX)
        and hasattr(m, "top_k")
        and hasattr(m, "num_experts")
    ]


def is_moe(model: nn.Module) -> bool:
    """Whether ``model`` has at least one router this module knows how to hook."""
    return bool(moe_routers(model))


# --------------------------------------------------------------------------------------------
# Routing records
# --------------------------------------------------------------------------------------------


@dataclass
class Routing:
    """Top-k expert indices per MoE layer, aligned with the ``[N, P+L]`` token positions.

    ``indices[r, i, t]`` are the k experts (in the router's slot order) that MoE layer r used for
    token position t of row i; ``-1`` marks positions that were not recorded (e.g. the last
    completion token, which the rollout engine never feeds back).
    """

    indices: torch.Tensor  # [R, N, T, k] long
    num_experts: int

    @property
    def num_layers(self) -> int:
        return self.indices.shape[0]

    @property
    def top_k(self) -> int:
        return self.indices.shape[-1]

    def rows(self, index: torch.Tensor) -> Routing:
        """The routing of rows ``index`` (a trainer micro-batch), same positions."""
        return Routing(self.indices[:, index.to(self.indices.device)], self.num_experts)


class RoutingCapture:
    """What the routers did during the forward calls inside a :func:`capture_routing` block.

    Per MoE layer and per forward call, ``used`` holds the flat ``[M, k]`` expert indices the
    experts received (the forced ones under replay), ``own`` the router's own top-k choice, and
    ``logits`` (when ``keep_logits``) the ``[M, E]`` router logits, still attached to the graph.
    M = rows x positions of that call (the MoE block flattens ``[B, S, H]`` to ``[B*S, H]``).
    """

    def __init__(self, num_layers: int, num_experts: int, keep_logits: bool) -> None:
        self.num_experts = num_experts
        self.keep_logits = keep_logits
        self.used: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.own: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.logits: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]

    def routing(self, num_rows: int, length: int | None = None, *, own: bool = False) -> Routing:
        """Stack the recorded calls into a :class:`Routing` of ``num_rows`` rows.

        Calls of one layer are consecutive token positions of the same rows (one full forward,
        or the engine's prefill then one call per decoded token), so each call is reshaped to
        ``[num_rows, S_call, k]`` and they are concatenated along positions. ``length`` pads
        (with -1) or trims the position axis to that many positions. ``own=True`` gives the
        router's own choices instead of the ones the experts used.
        """
        source = self.own if own else self.used
        if not source or not source[0]:
            raise ValueError("no routing was recorded (no forward call inside the block?)")
        layers = []
        for calls in source:
            parts = [c.reshape(num_rows, -1, c.shape[-1]) for c in calls]  # [N, S_c, k] each
            layers.append(torch.cat(parts, dim=1))  # [N, S, k]
        # clone(): the engine records under inference_mode; plain tensors can enter autograd.
        indices = torch.stack(layers).clone()  # [R, N, S, k]
        if length is not None:
            have = indices.shape[2]
            if have >= length:
                indices = indices[:, :, :length]
            else:
                pad = indices.new_full((*indices.shape[:2], length - have, indices.shape[3]), -1)
                indices = torch.cat([indices, pad], dim=2)  # [R, N, length, k]
        return Routing(indices, self.num_experts)


def _gate_weights(router: nn.Module, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gate weights [M, k] of experts ``index`` [M, k] from router ``logits`` [M, E].

    The same arithmetic as the HF router (softmax over all experts in float32, the chosen
    probabilities, renormalized when ``norm_topk_prob``), so when ``index`` equals the router's
    own top-k the result is bitwise the router's; gradients flow through ``logits``.
    """
    probs = F.softmax(logits, dim=-1, dtype=torch.float)  # [M, E]
    weights = probs.gather(-1, index)  # [M, k]
    if getattr(router, "norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


@contextlib.contextmanager
def routing_hooks(
    model: nn.Module,
    *,
    replay: Routing | None = None,
    capture: bool = True,
    keep_logits: bool = False,
) -> Iterator[RoutingCapture | None]:
    """Hook every router of ``model`` for the duration of the block.

    ``replay``: force these expert indices (``-1`` entries keep the router's own choice) in
    every forward call whose token count matches ``replay``'s rows x positions. ``capture``:
    record what the routers did (yields a :class:`RoutingCapture`, else None). A dense model
    yields None and is not touched, so callers need no MoE special case.
    """
    routers = moe_routers(model)
    if not routers or (replay is None and not capture):
        yield None
        return
    if replay is not None and replay.num_layers != len(routers):
        raise ValueError(
            f"replayed routing has {replay.num_layers} MoE layers, the model {len(routers)}"
        )
    rec = RoutingCapture(len(routers), routers[0].num_experts, keep_logits) if capture else None
    forced: list[torch.Tensor] = []
    if replay is not None:
        # The MoE block flattens [B, S, H] -> [B*S, H] row-major; flatten the record the same way.
        forced = [layer.reshape(-1, replay.top_k) for layer in replay.indices]  # [N*T, k] each

    def make_hook(layer: int):
        def hook(module: nn.Module, args: tuple, output: tuple) -> tuple | None:
            logits, weights, index = output  # [M, E], [M, k], [M, k]
            own = index
            if replay is not None:
                f = forced[layer].to(index.device)
                if f.shape != index.shape:
                    raise ValueError(
                        f"routing replay: layer {layer} routes {tuple(index.shape)} "
                        f"(tokens, k) but the record has {tuple(f.shape)}; replay needs the "
                        "same rows and positions as the recorded pass"
                    )
                index = torch.where(f >= 0, f, own)  # [M, k]
                weights = _gate_weights(module, logits, index)  # [M, k]
            if rec is not None:
                rec.used[layer].append(index.detach())
                rec.own[layer].append(own.detach())
                if rec.keep_logits:
                    rec.logits[layer].append(logits)
            return (logits, weights, index) if replay is not None else None

        return hook

    handles = [r.register_forward_hook(make_hook(i)) for i, r in enumerate(routers)]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


def capture_routing(
    model: nn.Module, *, keep_logits: bool = False
) -> contextlib.AbstractContextManager[RoutingCapture | None]:
    """``with capture_routing(model) as rec: model(...)`` records every router's choice
    (``rec`` is None for a dense model)."""
    return routing_hooks(model, capture=True, keep_logits=keep_logits)


def replay_routing(
    model: nn.Module, routing: Routing, *, capture: bool = False, keep_logits: bool = False
) -> contextlib.AbstractContextManager[RoutingCapture | None]:
    """``with replay_routing(model, routing): model(...)`` forces ``routing``'s experts; the gate
    weights are the current router's softmax over the forced experts (so the router trains)."""
    return routing_hooks(model, replay=routing, capture=capture, keep_logits=keep_logits)
