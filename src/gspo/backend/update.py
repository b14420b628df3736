"""The policy update of one scored batch, read top to bottom as the loop reads
(:mod:`gspo.orchestration.loop`):

    update_policy:  for each minibatch (:func:`minibatches`): one optimizer step
        micro_batches   its forwards: gradient rows, idle rows' no-grad forwards, a rank's share
        micro_batch_step    forward ─► loss ─► backward, metrics into the accumulator
        optimizer_step      clip, step (skipped when non-finite), zero the gradients

The batch is the loop's :class:`~gspo.rollout.base.RolloutBatch`: rollout, old log-probs,
advantages, correction weights and step. What a forward takes beyond a micro-batch's tokens
(image inputs, MoE routing to replay and record, the load-balancing loss) is the model side's
:class:`~gspo.models.forward_inputs.ForwardInputs`, so the update runs every model the same
way. The local backend runs it in this process; each FSDP2 rank runs it on its share.

One name per thing: ``batch`` the scored batch, ``minibatch`` the row indices [n_mb] of one
optimizer step, ``micro`` one forward's :class:`MicroBatch`, ``rows`` row indices of the batch.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from gspo.backend.options import (
    loss_kl_coef,
    loss_options,
    mismatch_stats,
    rollout_logprobs,
    sequence_weights,
)
from gspo.config.fields import MINIBATCH_GROUPINGS
from gspo.config.options_train import OptimOptions
from gspo.config.train import TrainConfig
from gspo.core.losses import policy_loss
from gspo.core.seeding import step_generator
from gspo.models import compiled_forward, moe
from gspo.models.forward_inputs import ForwardInputs, independent_rows
from gspo.models.logprobs import model_kind
from gspo.rollout.base import PIXELS, Rollout, RolloutBatch, pixel_rows

from .accumulator import Accumulator
from .shard import all_ranks_sum, rank_parts


def lr_lambda(warmup_steps: int):
    """The LR schedule's factor: linear warmup over ``warmup_steps``, then constant."""
    return lambda i: min(1.0, (i + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def build_optimizer(optim: OptimOptions, model: torch.nn.Module, *, fused: bool | None):
    """(AdamW, LR schedule) of a backend's policy, from the options' lr, betas, weight decay and
    warmup (the local backend and every FSDP2 rank build the same one). ``fused``: one fused
    kernel instead of a dozen foreach ops per step, ~3-4x faster on CPU (None: torch decides)."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=optim.lr,
        betas=(optim.adam_beta1, optim.adam_beta2),
        weight_decay=optim.weight_decay,
        fused=fused,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim.warmup_steps))


def update_policy(
    cfg: TrainConfig,
    model,
    ref_model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    batch: RolloutBatch,
    *,
    shard: tuple[int, int] | None = None,
    acc: Accumulator | None = None,
) -> dict[str, float]:
    """``num_minibatches`` optimizer steps over ``batch`` (its old log-probs and advantages
    filled in); the loss/clip/grad metrics.

    Inside a minibatch, micro-batches accumulate gradients; each gets the minibatch's global
    sequence and token counts as denominators, so the gradient equals one pass over the
    minibatch. ``shard=(rank, world)``: a data-parallel FSDP2 rank (:func:`micro_batches`);
    the minibatch loss is all-reduced so that a non-finite loss on any rank skips the update
    on all. ``acc``: where the metrics accumulate (a rank's raw sums, merged over ranks by
    :func:`gspo.backend.shard.merge_rank_metrics`).
    """
    model.train()
    acc = Accumulator() if acc is None else acc
    inputs = forward_inputs(cfg, model, batch.rollout, compile_local=shard is None)
    idle = zero_gradient_rows(cfg, model, batch.advantages)  # [N] rows that only need metrics
    acc.add_scalar(
        "advantage/zero_fraction", float(_zero_advantage(batch.advantages).float().mean())
    )
    for k, minibatch in enumerate(minibatches(cfg, batch)):
        micros = micro_batches(cfg, batch, minibatch, idle, inputs.whole_width, shard)
        if not any(micro.grad for micro in micros):
            _zero_grads(model)  # the update a zero gradient gives: Adam's moments still move
        counts = _Counts.of(batch.rollout, minibatch)
        loss = 0.0  # micro-batch losses are parts of the minibatch loss: they add up
        for micro in micros:
            loss += micro_batch_step(cfg, model, ref_model, inputs, batch, micro, counts, acc, k)
        optimizer_step(cfg, model, optimizer, scheduler, loss, acc, shard)
    model.eval()
    return acc.result()


def minibatches(cfg: TrainConfig, batch: RolloutBatch) -> list[torch.Tensor]:
    """Row indices of each minibatch (:func:`minibatch_rows`), drawn from the step's generator."""
    gen = step_generator(cfg.run.seed, batch.step, stream=1, device=torch.device("cpu"))
    return minibatch_rows(
        batch.num_samples,
        cfg.rollout.group_size,
        cfg.optim.num_minibatches,
        cfg.optim.minibatch_grouping,
        gen,
    )


def forward_inputs(
    cfg: TrainConfig, model, rollout: Rollout, *, compile_local: bool = False
) -> ForwardInputs:
    """What the batch's forwards take beyond its tokens: image inputs, MoE routing, and with
    the ``compile`` option on the local backend (``compile_local``) the compiled forward,
    where it applies (text models of the lean forward; FSDP2 ranks: eager)."""
    pixels = rollout.extras.get(PIXELS)
    compiled = cfg.optim.compile and compile_local and compiled_forward.applies(model, pixels)
    return ForwardInputs.of(
        model,
        rollout,
        pixels=pixels,
        pixel_index=pixel_rows(rollout),
        routing_replay=cfg.model.routing_replay,
        aux_coef=cfg.model.router_aux_loss_coef,
        temperature=cfg.rollout.temperature,
        compiled=compiled,
    )


def micro_batches(
    cfg: TrainConfig,
    batch: RolloutBatch,
    minibatch: torch.Tensor,
    idle: torch.Tensor,
    whole_width: bool,
    shard: tuple[int, int] | None,
) -> list[MicroBatch]:
    """The forwards of one minibatch, in order.

    Locally: rows with a gradient first; the idle ones run a no-grad forward for their metrics
    (or nothing, with zero_advantage_metrics off: they add 0 to the loss either way). A few
    idle rows stay in the gradient pass: a second forward costs more than they do. The same
    with the compile option: its gradient pass runs any count of rows at that count
    (:mod:`gspo.models.compiled_forward`), so idle rows there cost their backward too.

    A data-parallel rank (``shard=(rank, world)``) must run as many forwards and backwards as
    every other (each is a collective): it takes its rows ``minibatch[rank::world]``, all in
    the gradient pass, and pads with zero-weight passes up to the largest share's count.
    """
    size = cfg.optim.micro_batch_size or batch.num_samples
    idle_metrics = cfg.optim.zero_advantage_metrics
    if shard is not None:
        # Without their metrics, idle rows leave the pass as they do locally (every rank sees
        # the whole batch, so all drop the same rows and pad to the same count).
        own = minibatch if idle_metrics else minibatch[~idle[minibatch].cpu()]
        passes = rank_parts(own, shard, size, pad=minibatch[:1])
    else:
        live, rest = minibatch[~idle[minibatch]], minibatch[idle[minibatch]]
        if idle_metrics and len(rest) < cfg.optim.zero_advantage_split * len(minibatch):
            live, rest = minibatch, minibatch[:0]
        passes = [(rows, True) for rows in live.split(size) if len(rows)]
        if idle_metrics:  # (an empty split is [[]])
            passes += [(rows, False) for rows in rest.split(size) if len(rows)]
    # grad None: a zero-weight pass that keeps the ranks in step (it runs a backward too).
    return [
        micro_batch(
            batch.rollout, rows, cut=not whole_width, grad=grad is not False, padding=grad is None
        )
        for rows, grad in passes
    ]


def micro_batch_step(
    cfg: TrainConfig,
    model,
    ref_model,
    inputs: ForwardInputs,
    batch: RolloutBatch,
    micro: MicroBatch,
    counts: _Counts,
    acc: Accumulator,
    k: int,
) -> float:
    """Forward ─► loss ─► backward of one micro-batch of minibatch ``k`` (the first is
    on-policy); its metrics into ``acc``; its part of the minibatch loss."""
    share = len(micro.rows) / counts.rows
    forward = inputs.forward(model, micro.tokens, micro.rows, grad=micro.grad, share=share)
    ref = inputs.reference(ref_model, micro.tokens, micro.rows)
    core = compiled_forward.loss_core if inputs.compiled else None
    loss, metrics = micro_batch_loss(cfg, batch, micro, forward.logprobs, ref, counts, core)
    loss = forward.loss(loss)  # MoE: plus the load-balancing loss (router_aux_loss_coef > 0)
    metrics.update(forward.metrics)
    if micro.padding:
        (loss * 0.0).backward()
        return 0.0
    if micro.grad:
        loss.backward()
    mask = micro.loss_mask  # [n, L']
    tokens = int(mask.sum())
    metrics["entropy"] = float((forward.entropy.detach() * mask).sum()) / max(tokens, 1)
    acc.add(metrics, tokens, int(mask.any(dim=1).sum()), off_policy=k > 0)
    return float(loss.detach())


def micro_batch_loss(
    cfg: TrainConfig,
    batch: RolloutBatch,
    micro: MicroBatch,
    logprobs,
    ref,
    counts: _Counts,
    core=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one micro-batch (the registry's objective) and its metrics, with the
    minibatch's denominators; ``core``: :func:`gspo.core.losses.policy_loss`'s (the compiled
    one with the ``compile`` option)."""
    cols = micro.columns
    advantages = batch.advantages[micro.rows]  # [n] or [n, L]
    # Off-policy sequence mask against the engine's log-probs (None unless enabled).
    keep, opsm = sequence_weights(
        cfg, logprobs, batch.rollout.logprobs[micro.rows][:, cols], advantages, micro.loss_mask
    )
    loss, metrics = policy_loss(
        cfg.loss.algo,
        logprobs,
        batch.old_logprobs[micro.rows][:, cols].to(logprobs.dtype),
        _columns(advantages, cols).to(logprobs.dtype),
        micro.loss_mask,
        clip_low=cfg.loss.clip_low,
        clip_high=cfg.loss.clip_high,
        aggregation=cfg.loss.aggregation,
        num_sequences=max(counts.sequences, 1),
        num_tokens=max(counts.tokens, 1),
        constant=cfg.loss.loss_constant or float(cfg.rollout.max_new_tokens),
        ref_logprobs=ref,
        kl_coef=loss_kl_coef(cfg),
        kl_estimator=cfg.loss.kl_estimator,
        weights=_product(keep, _row_weights(batch.weights, micro.rows, cols)),
        options=loss_options(cfg),
        core=core,
    )
    metrics.update(opsm)
    return loss, metrics


def optimizer_step(
    cfg: TrainConfig, model, optimizer, scheduler, loss: float, acc: Accumulator, shard
) -> None:
    """One optimizer step on the accumulated gradients of a minibatch whose loss is ``loss``;
    skipped (and counted) when the loss or the gradient norm is not finite."""
    if shard is not None:  # the whole minibatch's loss: the same skip decision on every rank
        loss = all_ranks_sum(loss)
    acc.add_scalar("loss", loss)  # mean over minibatches
    grad_norm = torch.nn.utils.clip_grad_norm_(
        model.parameters(), cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
    )
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: the global norm, as a plain tensor
        grad_norm = grad_norm.full_tensor()
    if math.isfinite(float(grad_norm)) and math.isfinite(loss):
        acc.add_scalar("grad_norm", float(grad_norm))
        optimizer.step()
        scheduler.step()  # the schedule counts updates made, so a skip does not advance it
        skipped = 0.0
    else:
        # A non-finite loss or gradient would poison the weights and Adam's moments for
        # good: drop this update and count it.
        skipped = 1.0
    acc.add_scalar("faults/skipped_updates", skipped, reduce="sum")
    optimizer.zero_grad(set_to_none=True)


@dataclass
class _Counts:
    """A minibatch's denominators: its rows, and the sequences and tokens of its policy mask."""

    rows: int
    sequences: int
    tokens: int

    @classmethod
    def of(cls, rollout: Rollout, minibatch: torch.Tensor) -> _Counts:
        mask = rollout.policy_mask[minibatch]  # [n_mb, L] policy tokens only (multi-turn: no env)
        return cls(len(minibatch), int((mask.sum(dim=1) > 0).sum()), int(mask.sum()))


def zero_gradient_rows(cfg: TrainConfig, model, advantages: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows whose loss term and gradient are exactly 0, so they need no backward.

    A row whose advantage is 0 at every token adds 0 * ratio to the objective (clipped or not),
    so its gradient is 0 (group-normalized advantages are 0 for every row of a group whose
    rewards all agree: common on a mostly solved or mostly failed task). Not so with a KL
    penalty (its gradient reaches every row) or for MoE models (the load-balancing loss and the
    routing records span the whole forward), where every row keeps its backward.
    """
    if cfg.loss.kl_coef != 0.0 or not independent_rows(model):
        return torch.zeros(advantages.shape[0], dtype=torch.bool, device=advantages.device)  # [N]
    return _zero_advantage(advantages)  # [N]


def _zero_advantage(advantages: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows whose advantage ([N] or [N, T]) is 0 at every token."""
    return (advantages == 0).reshape(advantages.shape[0], -1).all(dim=1)  # [N]


def _zero_grads(model) -> None:
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)


def _old_logprobs(
    cfg: TrainConfig, model, rollout: Rollout
) -> tuple[torch.Tensor, dict[str, float]]:
    if cfg.rollout.old_logprobs == "engine":
        return rollout.logprobs, {}
    if not model_kind(model).moe:
        with torch.no_grad():
            recomputed = rollout_logprobs(model, rollout, cfg.rollout.temperature)  # [N, L]
        return recomputed, mismatch_stats(recomputed, rollout.logprobs, rollout.policy_mask)
    # MoE: the same pass records the pre-update policy's routing (what R2 replays).
    with torch.no_grad(), moe.capture_routing(model) as routes:
        recomputed = rollout_logprobs(model, rollout, cfg.rollout.temperature)  # [N, L]
    if routes is not None:
        length = rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
        rollout.extras["old_routing"] = routes.routing(rollout.num_samples, length)
    return recomputed, mismatch_stats(recomputed, rollout.logprobs, rollout.policy_mask)


def _product(keep: torch.Tensor | None, weights: torch.Tensor | None) -> torch.Tensor | None:
    """The off-policy mask [n] times the mismatch-correction weights ([n] or [n, L]), or either."""
    if keep is None or weights is None:
        return weights if keep is None else keep
    keep = keep.to(weights.dtype)  # [n]
    return keep[:, None] * weights if weights.dim() == 2 else keep * weights


def _row_weights(weights: torch.Tensor | None, rows: torch.Tensor, cols: slice):
    """A micro-batch's rows (and kept columns, for token-level weights) of the correction."""
    if weights is None:
        return None
    w = weights[rows]  # [n] or [n, L]
    return w[:, cols] if w.dim() == 2 else w


def minibatch_rows(
    n_rows: int, group_size: int, num_minibatches: int, grouping: str, generator: torch.Generator
) -> list[torch.Tensor]:
    """Row indices of each minibatch of a rollout laid out group after group.

    ``shuffled``: rows shuffled across groups, then cut into ``num_minibatches`` equal parts.
    ``groups``: groups shuffled, each kept whole, so a minibatch holds
    ``n_rows / group_size / num_minibatches`` complete groups (needs that to divide evenly);
    the training pass then runs each of its prompts once for all of the group's samples.
    """
    if grouping == "shuffled":
        return list(torch.randperm(n_rows, generator=generator).chunk(num_minibatches))
    if grouping not in MINIBATCH_GROUPINGS:
        raise ValueError(
            f"unknown minibatch_grouping {grouping!r}; one of {', '.join(map(repr, MINIBATCH_GROUPINGS))}"
        )
    n_groups = n_rows // group_size
    if n_groups * group_size != n_rows or n_groups % num_minibatches != 0:
        raise ValueError(
            f"minibatch_grouping='groups' needs {n_rows} rows in whole groups of {group_size} "
            f"that split evenly into {num_minibatches} minibatches"
        )
    groups = torch.randperm(n_groups, generator=generator)  # [n_groups]
    rows = (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)  # [N]
    return list(rows.chunk(num_minibatches))


@dataclass
class MicroBatch:
    """One forward's rows of the batch, without the columns that are padding in all of them:
    prompts are left-padded to the batch's longest prompt and completions right-padded to its
    longest, and a micro-batch only needs its own widths (padding columns change no value,
    only cost FLOPs)."""

    rows: torch.Tensor  # [n] which rows of the batch
    prompt_ids: torch.Tensor  # [n, P']
    prompt_mask: torch.Tensor  # [n, P']
    completion_ids: torch.Tensor  # [n, L']
    completion_mask: torch.Tensor  # [n, L']
    columns: slice  # which of the batch's L completion columns L' is
    loss_mask: torch.Tensor  # [n, L'] policy tokens (completion_mask but for env tokens)
    grad: bool = True  # False: a no-grad forward, for the metrics of idle rows
    padding: bool = False  # a zero-weight pass that keeps the FSDP2 ranks in step

    @property
    def tokens(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask


def micro_batch(
    rollout: Rollout, rows: torch.Tensor, *, cut: bool, grad: bool = True, padding: bool = False
) -> MicroBatch:
    """Rows ``rows`` of ``rollout``, the padding columns cut when ``cut``."""
    prompt_mask = rollout.prompt_mask[rows]  # [n, P]
    completion_mask = rollout.completion_mask[rows]  # [n, L]
    p_cols, c_cols = slice(None), slice(None)
    if cut:
        p_used = prompt_mask.any(dim=0).nonzero()  # [P', 1]
        c_used = completion_mask.any(dim=0).nonzero()  # [L', 1]
        # At least one column each: token_logprobs needs a prompt token, and an all-empty
        # micro-batch keeps one (masked) completion column.
        p_cols = slice(int(p_used[0]) if len(p_used) else prompt_mask.shape[1] - 1, None)
        c_cols = slice(0, int(c_used[-1]) + 1 if len(c_used) else 1)
    return MicroBatch(
        rows=rows,
        prompt_ids=rollout.prompt_ids[rows][:, p_cols],
        prompt_mask=prompt_mask[:, p_cols],
        completion_ids=rollout.completion_ids[rows][:, c_cols],
        completion_mask=completion_mask[:, c_cols],
        columns=c_cols,
        loss_mask=rollout.policy_mask[rows][:, c_cols],
        grad=grad,
        padding=padding,
    )


def _columns(advantages: torch.Tensor, cols: slice) -> torch.Tensor:
    """Per-token advantages [n, L] cut to a micro-batch's columns; [n] ones stay as they are."""
    return advantages[:, cols] if advantages.dim() == 2 else advantages


def _frozen_copy(model):
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref
