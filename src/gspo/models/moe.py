"""Mixture-of-Experts support: tiny MoE models, router capture, Routing Replay, routing metrics.

Why this exists. The GSPO paper's infrastructure claim is about MoE policies: after one gradient
step about 10% of the experts a token activates change (48-layer Qwen3-30B-A3B), which makes
token-level importance ratios volatile; GRPO needs *Routing Replay* to converge, GSPO does not.
This module lets a run measure that and switch replay on:

- ``build_tiny_moe_model``: a random-init Qwen3-MoE (no shared expert) or, with
  ``shared_expert=True``, Qwen2-MoE (one sigmoid-gated shared expert per layer) causal LM.
- ``capture_routing(model)``: a context manager that records, for every MoE layer, the top-k
  expert indices each token position was routed to (and optionally the router logits, for the
  auxiliary load-balancing loss). It works for a full forward (``token_logprobs``) and for the
  rollout engine's prefill + KV-cached decode steps alike.
- ``replay_routing(model, routing)``: forces recorded expert indices in a later forward (R2:
  the old policy's recompute pass; R3: the rollout engine's generation). The gate weights still
  come from the *current* router logits, softmax over the forced experts, so the router keeps
  receiving gradients (papers.md §3.4).
- ``routing_change``, ``load_stats``, ``aux_loss``: the ``moe/*`` metrics and the aux loss.

How. Hooks, not module surgery: a forward hook on each router module (``Qwen3MoeTopKRouter``,
``Qwen2MoeTopKRouter`` in transformers 5.x, which return ``(router_logits, top_k_weights,
top_k_index)``) reads and, for replay, replaces its output. State-dict keys, checkpoints and the
experts kernel are untouched, and hooks exist only inside the ``with`` block.

Layout of a :class:`Routing`: ``indices`` is ``[R, N, T, k]`` (R MoE layers in model order, N rows,
T = P + L token positions of ``cat(prompt, completion)``, k experts), ``-1`` where nothing was
recorded. The experts that score completion token j sit at position ``P - 1 + j`` (the position
that predicts it): :func:`scored_positions` builds that mask, and every metric here is over
those positions only, so prompt padding and completion padding never count.

Experts kernel: transformers' default ``grouped_mm`` kernel works on CPU in float32/bf16 but has
no float64 kernel, and ``batched_mm`` is 10-60x slower on CPU (cpu-feasibility.md §2), so
:func:`fit_experts_kernel` switches float64 models to ``eager`` and never picks ``batched_mm``.

Files: this module holds the tiny MoE models, the experts kernel, the trainer glue and every
public name; capture and replay are in :mod:`gspo.models.moe_routing`, the metrics and the aux
loss in :mod:`gspo.models.moe_metrics`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gspo.config.names import ROUTING_REPLAY

from .logprobs import token_logprobs
from .moe_metrics import _load_balancing_fn, aux_loss, load_stats, routing_change, scored_positions
from .moe_routing import (
    ROUTER_CLASS_SUFFIX,
    Routing,
    RoutingCapture,
    _gate_weights,
    capture_routing,
    is_moe,
    moe_routers,
    replay_routing,
    routing_hooks,
)
from .tiny_model import build_tiny_model

__all__ = [
    "ROUTER_CLASS_SUFFIX",
    "ROUTING_REPLAY",
    "Routing",
    "RoutingCapture",
    "_gate_weights",
    "_load_balancing_fn",
    "aux_loss",
    "build_tiny_moe_model",
    "capture_routing",
    "fit_experts_kernel",
    "generate_with_routing",
    "is_moe",
    "load_stats",
    "micro_batch_terms",
    "moe_routers",
    "old_routing",
    "replay_routing",
    "replay_source",
    "routing_change",
    "routing_hooks",
    "scored_positions",
    "step_metrics",
    "training_forward",
]

# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def build_tiny_moe_model(
    vocab_size: int, *, num_experts: int = 8, top_k: int = 2, **kw: Any
) -> nn.Module:
    """A small random-init MoE causal LM (every layer MoE) with tied embeddings, float32 on CPU.

    ``shared_expert=False`` builds ``Qwen3MoeForCausalLM`` (routed experts only, like
    Qwen3-30B-A3B); ``True`` builds ``Qwen2MoeForCausalLM``, whose MoE layers add one shared
    expert (width ``moe_intermediate_size``) scaled by a sigmoid gate. ``moe_intermediate_size``
    defaults to ``hidden_size`` (cpu-feasibility.md §2: costs about a dense model of the same
    width at top-2). ``norm_topk_prob=True`` renormalizes the top-k gate weights to sum to 1, as
    Qwen3-MoE checkpoints do; the replay gate g_i = I_i exp(s_i) / Σ_j I_j exp(s_j) of papers.md
    §3.4 is exactly that.

    The other arguments (``hidden_size``, ``seed``, ``moe_intermediate_size``,
    ``shared_expert``, ``norm_topk_prob``, ...) and their defaults are
    :func:`~gspo.models.tiny_model.build_tiny_model`'s: this is that builder with experts.
    Weights depend only on the arguments (``seed`` included); the global RNG is left untouched.
    """
    if num_experts < 1:  # 0 would build the dense model
        raise ValueError(f"need 1 <= top_k <= num_experts, got top_k={top_k}, {num_experts}")
    return build_tiny_model(vocab_size, num_experts=num_experts, top_k=top_k, **kw)


def fit_experts_kernel(model: nn.Module) -> nn.Module:
    """Pick an experts kernel that runs at the model's dtype on its device (returns the model).

    ``grouped_mm`` (transformers' default) has no float64 kernel, so float64 models switch to
    ``eager``; everything else is left alone. ``batched_mm`` is never chosen (very slow on CPU).
    No-op for dense models.
    """
    if not is_moe(model) or not hasattr(model, "set_experts_implementation"):
        return model
    dtype = next(model.parameters()).dtype
    current = getattr(model.config, "_experts_implementation", None)
    if dtype == torch.float64 and current in (None, "grouped_mm", "batched_mm"):
        model.set_experts_implementation("eager")
    return model


# --------------------------------------------------------------------------------------------
# Trainer glue (kept here so the RL loop stays free of MoE special cases)
# --------------------------------------------------------------------------------------------


def generate_with_routing(engine, request):
    """``engine.generate`` with the engine model's routing (prefill + every decode step) stored
    as ``rollout.extras["routing"]`` (a [R, N, P+L, k] :class:`Routing`; the last completion
    token's position, never fed to the engine, is -1). This is what R3 replays. An engine
    without a torch module (vLLM) records no routing: plain ``engine.generate``."""
    if getattr(engine, "model", None) is None:
        return engine.generate(request)
    with capture_routing(engine.model) as rec:
        rollout = engine.generate(request)
    if rec is not None:
        length = rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
        rollout.extras["routing"] = rec.routing(rollout.num_samples, length)
    return rollout


def replay_source(mode: str | None, rollout, model: nn.Module) -> Routing | None:
    """The routing the training forwards replay: None (``mode`` None or ``none``), the recompute
    pass's (R2, ``old``) or the engine's (R3, ``engine``). Raises if the mode needs a record the
    step did not make."""
    if mode is None or mode == "none":
        return None
    if mode not in ROUTING_REPLAY:
        raise ValueError(f"routing_replay must be one of {', '.join(ROUTING_REPLAY)}, got {mode!r}")
    if not is_moe(model):
        raise ValueError(f"routing_replay={mode!r} needs an MoE model; this one has no routers")
    key = {"old": "old_routing", "engine": "routing"}[mode]
    if key not in rollout.extras:
        hint = "old_logprobs='recompute'" if mode == "old" else "an MoE rollout engine"
        raise ValueError(f"routing_replay={mode!r} found no recorded routing (needs {hint})")
    return rollout.extras[key]


def old_routing(rollout) -> Routing | None:
    """The pre-update policy's routing for this rollout: the recompute pass's when there was
    one, else the engine's."""
    return rollout.extras.get("old_routing", rollout.extras.get("routing"))


def training_forward(model: nn.Module, replay: Routing | None, part: torch.Tensor, aux: bool):
    """Hooks for one trainer micro-batch forward: replay rows ``part`` of ``replay`` (if any) and
    capture routing (with logits when ``aux``). A no-op block for dense models."""
    return routing_hooks(
        model, replay=replay.rows(part) if replay is not None else None, keep_logits=aux
    )


def micro_batch_terms(
    model: nn.Module,
    rec: RoutingCapture | None,
    old: Routing | None,
    prompt_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    rows: torch.Tensor,
    *,
    aux_coef: float,
    weight: float,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The aux-loss term to add to a micro-batch loss, and its ``moe/*`` metrics.

    ``rec``: the micro-batch forward's routing; ``old``: the pre-update policy's
    (:func:`old_routing`) over the whole batch; ``prompt_mask`` [n, P] and ``completion_mask``
    [n, L]: the masks of its batch rows ``rows`` [n], at the batch's full width (as the
    routing records are). ``weight`` is the micro-batch's share of its minibatch's sequences,
    so that micro-batch aux losses add up to about the minibatch's (exactly with one
    micro-batch: HF's aux loss is a product of token means and does not split exactly).
    ``moe/routing_change_loss`` is the routing the loss's forward used vs the pre-update
    policy's: 0 under replay by construction.
    """
    if rec is None:
        return None, {}
    metrics: dict[str, float] = {}
    term = None
    if rec.keep_logits:
        mask = torch.cat([prompt_mask, completion_mask], dim=1)  # [n, P+L]
        value = aux_loss(model, rec, mask)
        metrics["moe/aux_loss"] = float(value.detach())
        if aux_coef > 0:
            term = aux_coef * weight * value
    if old is not None:
        length = prompt_mask.shape[1] + completion_mask.shape[1]
        used = rec.routing(len(rows), length)
        pos = scored_positions(prompt_mask.shape[1], completion_mask)
        metrics["moe/routing_change_loss"] = routing_change(old.rows(rows), used, pos)["change"]
    return term, metrics


@torch.no_grad()
def step_metrics(model: nn.Module, rollout) -> dict[str, float]:
    """``moe/*`` metrics of one RL step, from one extra no-grad forward of the updated policy.

    - ``moe/routing_change``: the updated policy's own routing vs the pre-update policy's
      (:func:`old_routing`) on the same rollout, :func:`routing_change` ``change`` over the
      scored response positions; ``moe/routing_change_any`` and ``moe/routing_change_token``
      are its (position, layer) and per-position variants. This is the GSPO paper's §5.3 number.
    - ``moe/routing_change_engine``: the engine's routing vs the recompute pass's, both of the
      pre-update policy (training-inference routing mismatch; present with both records).
    - ``moe/load_max_share``, ``moe/load_cv``: :func:`load_stats` of the pre-update routing.
    Empty for a dense model or a rollout without routing records.
    """
    old = old_routing(rollout)
    if old is None or not is_moe(model):
        return {}
    was_training = model.training
    model.eval()
    with capture_routing(model) as rec:
        token_logprobs(
            model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
        )  # routing only: it does not depend on the sampling temperature
    model.train(was_training)
    prompt_len = rollout.prompt_ids.shape[1]
    length = prompt_len + rollout.completion_ids.shape[1]
    new = rec.routing(rollout.num_samples, length)
    pos = scored_positions(prompt_len, rollout.completion_mask)
    change = routing_change(old, new, pos)
    load = load_stats(old, pos)
    out = {
        "moe/routing_change": change["change"],
        "moe/routing_change_any": change["any"],
        "moe/routing_change_token": change["token"],
        "moe/load_max_share": load["max_share"],
        "moe/load_cv": load["cv"],
    }
    if "routing" in rollout.extras and "old_routing" in rollout.extras:
        engine = rollout.extras["routing"]
        out["moe/routing_change_engine"] = routing_change(
            rollout.extras["old_routing"], engine, pos
        )["change"]
    return out
