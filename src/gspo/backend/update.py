"""The local policy update of one batch: minibatches, micro-batches, old/ref log-probs.

Moved verbatim from the training loop; ``LocalBackend`` in a later step wraps it behind
:class:`gspo.backend.base.TrainingBackend`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from gspo.backend.options import loss_kl_coef, loss_options, rollout_logprobs, sequence_weights
from gspo.config.combinations import Options
from gspo.config.fields import MINIBATCH_GROUPINGS
from gspo.config.options_train import OptimOptions
from gspo.core.losses import policy_loss
from gspo.core.mismatch import mismatch_stats
from gspo.core.seeding import step_generator
from gspo.models import moe
from gspo.models.logprobs import token_logprobs
from gspo.rollout.base import PIXELS, Rollout, pixel_rows

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
    cfg: Options,
    model,
    ref_model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    rollout: Rollout,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    step: int,
    weights: torch.Tensor | None = None,
    shard: tuple[int, int] | None = None,
    acc: Accumulator | None = None,
) -> dict[str, float]:
    """Split the rollout batch into ``num_minibatches`` minibatches (``minibatch_rows``), one
    optimizer step each.

    Inside a minibatch, micro-batches accumulate gradients; each gets the minibatch's global
    sequence and token counts as denominators, so the gradient equals one pass over the minibatch.

    ``shard=(rank, world)``: a data-parallel FSDP2 rank. Every rank must run the same number of
    forwards and backwards (each is a collective), so a rank takes its rows ``mb[rank::world]``
    all in the gradient pass (no idle-row split) and pads with zero-weight passes up to the
    largest share's micro-batch count; the minibatch loss is all-reduced so that a non-finite
    loss on any rank skips the update on all. ``acc``: where the metrics accumulate (a rank's
    raw sums, merged over ranks by :func:`gspo.backend.shard.merge_rank_metrics`).
    """
    model.train()
    n = rollout.num_samples
    gen = step_generator(cfg.run.seed, step, stream=1, device=torch.device("cpu"))
    minibatches = minibatch_rows(
        n, cfg.rollout.group_size, cfg.optim.num_minibatches, cfg.optim.minibatch_grouping, gen
    )
    micro = cfg.optim.micro_batch_size or n
    # MoE routing records (replay, aux loss) are laid out over the rollout's full width.
    trim = not moe.is_moe(model)
    acc = Accumulator() if acc is None else acc
    constant = cfg.loss.loss_constant or float(cfg.rollout.max_new_tokens)
    # MoE Routing Replay: the expert choice recorded by the old pass (R2) or the engine (R3).
    replay = moe.replay_source(cfg.model.routing_replay, rollout, model)
    idle = zero_gradient_rows(cfg, model, advantages)  # [N] rows that only need metrics
    acc.add_scalar("advantage/zero_fraction", float(_zero_advantage(advantages).float().mean()))
    for k, mb in enumerate(minibatches):
        mask = rollout.policy_mask[mb]  # [n_mb, L] policy tokens only (multi-turn: no env)
        n_seq = int((mask.sum(dim=1) > 0).sum())
        n_tok = int(mask.sum())
        mb_loss = 0.0  # micro-batch losses are parts of the minibatch loss: they add up
        if shard is not None:  # data-parallel rank (rank, world): its rows, global denominators
            # Without their metrics, idle rows leave the pass as they do locally (every rank
            # sees the whole batch, so all drop the same rows and pad to the same count).
            rows = mb if cfg.optim.zero_advantage_metrics else mb[~idle[mb].cpu()]
            parts = rank_parts(rows, shard, micro, pad=mb[:1])
        else:
            # Rows with a gradient first; the idle ones run a no-grad forward for their metrics
            # (or nothing, with zero_advantage_metrics off: they add 0 to the loss either way).
            # A few idle rows stay in the gradient pass: a second forward costs more than they do.
            live, rest = mb[~idle[mb]], mb[idle[mb]]
            if cfg.optim.zero_advantage_metrics and len(
                rest
            ) < cfg.optim.zero_advantage_split * len(mb):
                live, rest = mb, mb[:0]
            parts = [(p, True) for p in live.split(micro) if len(p)]
            if cfg.optim.zero_advantage_metrics:
                parts += [(p, False) for p in rest.split(micro) if len(p)]  # (empty split: [[]])
            if len(live) == 0:
                _zero_grads(model)  # the update a zero gradient gives: Adam's moments still move
        for part, needs_grad in parts:
            padding = needs_grad is None  # a zero-weight pass that keeps the ranks in step
            needs_grad = needs_grad is not False
            rows = _rows(rollout, part, trim)  # this micro-batch's rows, padding columns cut
            # MoE: replay/capture the routing of this forward (a no-op block for dense models).
            with (
                torch.set_grad_enabled(needs_grad),
                moe.training_forward(model, replay, part, aux=True) as routes,
            ):
                logprobs, entropy = token_logprobs(
                    model,
                    *rows.tensors,
                    temperature=cfg.rollout.temperature,
                    with_entropy=True,
                    prompt_index=rollout.prompt_index[part],  # a group's prompt runs once
                    pixels=rollout.extras.get(PIXELS),  # image prompts: the rollout's own
                    pixel_index=pixel_rows(rollout)[part],
                )  # [n_micro, L'] each
            ref = _ref_logprobs(
                cfg, ref_model, rows, rollout.prompt_index[part], rollout.extras.get(PIXELS),
                pixel_rows(rollout)[part],
            )  # fmt: skip
            # Off-policy sequence mask against the engine's log-probs (None unless enabled).
            keep, opsm = sequence_weights(
                cfg,
                logprobs,
                rollout.logprobs[part][:, rows.completion_cols],
                advantages[part],
                rows.loss_mask,
            )
            loss, metrics = policy_loss(
                cfg.loss.algo,
                logprobs,
                old_logprobs[part][:, rows.completion_cols].to(logprobs.dtype),
                _columns(advantages[part], rows.completion_cols).to(logprobs.dtype),
                rows.loss_mask,
                clip_low=cfg.loss.clip_low,
                clip_high=cfg.loss.clip_high,
                aggregation=cfg.loss.aggregation,
                num_sequences=max(n_seq, 1),
                num_tokens=max(n_tok, 1),
                constant=constant,
                ref_logprobs=ref,
                kl_coef=loss_kl_coef(cfg),
                kl_estimator=cfg.loss.kl_estimator,
                weights=_product(keep, _part_weights(weights, part, rows.completion_cols)),
                options=loss_options(cfg),
            )
            metrics.update(opsm)
            aux, moe_metrics = moe.micro_batch_terms(
                model,
                routes,
                rollout,
                part,
                aux_coef=cfg.model.router_aux_loss_coef,
                weight=len(part) / len(mb),
            )
            if aux is not None:
                loss = loss + aux  # load-balancing loss (router_aux_loss_coef > 0)
            metrics.update(moe_metrics)
            if padding:
                (loss * 0.0).backward()
                continue
            if needs_grad:
                loss.backward()
            m = rows.loss_mask  # [n_micro, L']
            tokens = int(m.sum())
            metrics["entropy"] = float((entropy.detach() * m).sum()) / max(tokens, 1)
            mb_loss += float(loss.detach())
            acc.add(metrics, tokens, int(m.any(dim=1).sum()), off_policy=k > 0)
        if shard is not None:  # the whole minibatch's loss: the same skip decision on every rank
            mb_loss = all_ranks_sum(mb_loss)
        acc.add_scalar("loss", mb_loss)  # mean over minibatches
        grad_norm = torch.nn.utils.clip_grad_norm_(
            model.parameters(), cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
        )
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: the global norm, as a plain tensor
            grad_norm = grad_norm.full_tensor()
        if math.isfinite(float(grad_norm)) and math.isfinite(mb_loss):
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
    model.eval()
    return acc.result()


def zero_gradient_rows(cfg: Options, model, advantages: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows whose loss term and gradient are exactly 0, so they need no backward.

    A row whose advantage is 0 at every token adds 0 * ratio to the objective (clipped or not),
    so its gradient is 0 (group-normalized advantages are 0 for every row of a group whose
    rewards all agree: common on a mostly solved or mostly failed task). Not so with a KL
    penalty (its gradient reaches every row) or for MoE models (the load-balancing loss and the
    routing records span the whole forward), where every row keeps its backward.
    """
    if cfg.loss.kl_coef != 0.0 or moe.is_moe(model):
        return torch.zeros(advantages.shape[0], dtype=torch.bool, device=advantages.device)  # [N]
    return _zero_advantage(advantages)  # [N]


def _zero_advantage(advantages: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows whose advantage ([N] or [N, T]) is 0 at every token."""
    return (advantages == 0).reshape(advantages.shape[0], -1).all(dim=1)  # [N]


def _zero_grads(model) -> None:
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)


def _old_logprobs(cfg: Options, model, rollout: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
    if cfg.rollout.old_logprobs == "engine":
        return rollout.logprobs, {}
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


def _part_weights(weights: torch.Tensor | None, part: torch.Tensor, cols: slice):
    """A micro-batch's rows (and kept columns, for token-level weights) of the correction."""
    if weights is None:
        return None
    w = weights[part]  # [n] or [n, L]
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
class _Rows:
    """One micro-batch's slice of a rollout, without the columns that are padding in all of its
    rows: prompts are left-padded to the rollout's longest prompt and completions right-padded
    to its longest completion, and a micro-batch only needs its own widths (padding columns
    change no value, only cost FLOPs)."""

    prompt_ids: torch.Tensor  # [n, P']
    prompt_mask: torch.Tensor  # [n, P']
    completion_ids: torch.Tensor  # [n, L']
    completion_mask: torch.Tensor  # [n, L']
    completion_cols: slice  # which of the rollout's L columns L' is
    loss_mask: torch.Tensor  # [n, L'] policy tokens (completion_mask but for env tokens)

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask


def _rows(rollout: Rollout, part: torch.Tensor, trim: bool) -> _Rows:
    prompt_mask = rollout.prompt_mask[part]  # [n, P]
    completion_mask = rollout.completion_mask[part]  # [n, L]
    p_cols, c_cols = slice(None), slice(None)
    if trim:
        p_used = prompt_mask.any(dim=0).nonzero()  # [P', 1]
        c_used = completion_mask.any(dim=0).nonzero()  # [L', 1]
        # At least one column each: token_logprobs needs a prompt token, and an all-empty
        # micro-batch keeps one (masked) completion column.
        p_cols = slice(int(p_used[0]) if len(p_used) else prompt_mask.shape[1] - 1, None)
        c_cols = slice(0, int(c_used[-1]) + 1 if len(c_used) else 1)
    return _Rows(
        prompt_ids=rollout.prompt_ids[part][:, p_cols],
        prompt_mask=prompt_mask[:, p_cols],
        completion_ids=rollout.completion_ids[part][:, c_cols],
        completion_mask=completion_mask[:, c_cols],
        completion_cols=c_cols,
        loss_mask=rollout.policy_mask[part][:, c_cols],
    )


def _columns(advantages: torch.Tensor, cols: slice) -> torch.Tensor:
    """Per-token advantages [n, L] cut to a micro-batch's columns; [n] ones stay as they are."""
    return advantages[:, cols] if advantages.dim() == 2 else advantages


def _ref_logprobs(
    cfg: Options, ref_model, rows: _Rows, prompt_index: torch.Tensor, pixels=None, pixel_index=None
):
    if ref_model is None:
        return None
    with torch.no_grad():
        ref, _ = token_logprobs(
            ref_model,
            *rows.tensors,
            temperature=cfg.rollout.temperature,
            prompt_index=prompt_index,
            pixels=pixels,
            pixel_index=pixel_index,
        )
    return ref


def _frozen_copy(model):
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref
