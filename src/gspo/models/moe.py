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
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ROUTING_REPLAY = ("none", "old", "engine")
"""``routing_replay`` values: none (also None: off); old = R2 (the recompute pass of the pre-update policy);
engine = R3 (the rollout engine's own routing during generation)."""

ROUTER_CLASS_SUFFIX = "TopKRouter"
"""Router modules are found by class name (``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``, and
the same-shaped routers of other transformers 5.x MoE models) plus the attributes they need."""


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def build_tiny_moe_model(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_experts: int = 8,
    top_k: int = 2,
    moe_intermediate_size: int | None = None,
    shared_expert: bool = False,
    intermediate_size: int | None = None,
    norm_topk_prob: bool = True,
    max_position_embeddings: int = 256,
    seed: int = 0,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    attn_implementation: str = "sdpa",
) -> nn.Module:
    """A small random-init MoE causal LM (every layer MoE) with tied embeddings, float32 on CPU.

    ``shared_expert=False`` builds ``Qwen3MoeForCausalLM`` (routed experts only, like
    Qwen3-30B-A3B); ``True`` builds ``Qwen2MoeForCausalLM``, whose MoE layers add one shared
    expert (width ``moe_intermediate_size``) scaled by a sigmoid gate. ``moe_intermediate_size``
    defaults to ``hidden_size`` (cpu-feasibility.md §2: costs about a dense model of the same
    width at top-2). ``norm_topk_prob=True`` renormalizes the top-k gate weights to sum to 1, as
    Qwen3-MoE checkpoints do; the replay gate g_i = I_i exp(s_i) / Σ_j I_j exp(s_j) of papers.md
    §3.4 is exactly that.

    Weights depend only on the arguments (``seed`` included); the global RNG is left untouched.
    """
    from gspo.models import build_tiny_model

    if num_experts < 1:  # 0 would build the dense model
        raise ValueError(f"need 1 <= top_k <= num_experts, got top_k={top_k}, {num_experts}")
    return build_tiny_model(
        vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        attn_implementation=attn_implementation,
        num_experts=num_experts,
        top_k=top_k,
        moe_intermediate_size=moe_intermediate_size,
        shared_expert=shared_expert,
        norm_topk_prob=norm_topk_prob,
    )


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


# --------------------------------------------------------------------------------------------
# Trainer glue (kept here so the RL loop stays free of MoE special cases)
# --------------------------------------------------------------------------------------------


def generate_with_routing(engine, prompts, n, params, generator=None):
    """``engine.generate`` with the engine model's routing (prefill + every decode step) stored
    as ``rollout.extras["routing"]`` (a [R, N, P+L, k] :class:`Routing`; the last completion
    token's position, never fed to the engine, is -1). This is what R3 replays. An engine
    without a torch module (vLLM) records no routing: plain ``engine.generate``."""
    if getattr(engine, "model", None) is None:
        return engine.generate(prompts, n, params, generator)
    with capture_routing(engine.model) as rec:
        rollout = engine.generate(prompts, n, params, generator)
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
    rollout,
    part: torch.Tensor,
    *,
    aux_coef: float,
    weight: float,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The aux-loss term to add to a micro-batch loss, and its ``moe/*`` metrics.

    ``weight`` is the micro-batch's share of its minibatch's sequences, so that micro-batch aux
    losses add up to about the minibatch's (exactly with one micro-batch: HF's aux loss is a
    product of token means and does not split exactly). ``moe/routing_change_loss`` is the
    routing the loss's forward used vs the pre-update policy's: 0 under replay by construction.
    """
    if rec is None:
        return None, {}
    metrics: dict[str, float] = {}
    term = None
    if rec.keep_logits:
        mask = torch.cat([rollout.prompt_mask[part], rollout.completion_mask[part]], dim=1)
        value = aux_loss(model, rec, mask)
        metrics["moe/aux_loss"] = float(value.detach())
        if aux_coef > 0:
            term = aux_coef * weight * value
    old = old_routing(rollout)
    if old is not None:
        length = rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
        used = rec.routing(len(part), length)
        pos = scored_positions(rollout.prompt_ids.shape[1], rollout.completion_mask[part])
        metrics["moe/routing_change_loss"] = routing_change(old.rows(part), used, pos)["change"]
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
    from gspo.models import token_logprobs

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
