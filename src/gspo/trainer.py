"""The RL training loop, top to bottom.

One step:

    prompts ─► rollout engine ─► completions + engine log-probs ─► rewards ─► group advantages
            ─► (optional) old log-prob recompute ─► num_minibatches optimizer steps
            ─► weight sync to the engine ─► metrics / eval / checkpoint

The algorithm enters only through the loss registry (``gspo.losses.policy_loss``). Every random
choice of a step (which prompts, which samples, which minibatch) comes from a generator seeded by
(seed, step), so a run resumed from a checkpoint replays exactly what an unbroken run would do.

Note on-policy vs off-policy: the first minibatch of a rollout is on-policy (its ratios are 1 up
to engine/trainer numerics, so GSPO's and GRPO's gradients coincide there); the later minibatches
are off-policy, which is where the algorithms differ. Metrics with the suffix ``_off_policy``
cover minibatches 2..k only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import checkpoint as ckpt
from .advantages import group_advantages
from .build import (
    DTYPES,
    build_policy,
    build_task,
    decode_completions,
    encode_prompts,
    resolve_device,
    set_threads,
)
from .config import TrainConfig, to_dict
from .evaluation import evaluate
from .logging import MetricsLogger, progress_postfix
from .losses import policy_loss
from .models import token_logprobs
from .rewards import overlong_penalty, score
from .rollout.base import Rollout, SamplingParams
from .rollout.torch_engine import TorchEngine


@dataclass
class RunResult:
    output_dir: Path
    history: list[dict[str, Any]]
    """Every metrics record logged by this process (train steps and evals)."""
    final_eval: dict[str, float]
    model: Any
    tokenizer: Any


def step_generator(seed: int, step: int, stream: int, device: torch.device) -> torch.Generator:
    """A generator for one purpose (stream) of one step: independent of everything before it."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + step) * 16 + stream)
    return g


def prompt_indices(n_examples: int, step: int, batch: int, seed: int) -> list[int]:
    """Which training problems step ``step`` uses: epoch-wise shuffles, deterministic from seed."""
    out: list[int] = []
    pos = step * batch
    while len(out) < batch:
        epoch, offset = divmod(pos, n_examples)
        perm = torch.randperm(
            n_examples, generator=torch.Generator().manual_seed(seed * 7919 + epoch)
        )
        take = min(batch - len(out), n_examples - offset)
        out += perm[offset : offset + take].tolist()
        pos += take
    return out


def lr_lambda(warmup_steps: int):
    return lambda i: min(1.0, (i + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def train(cfg: TrainConfig, *, resume: bool = False) -> RunResult:
    """Run (or resume) the RL run described by ``cfg``."""
    set_threads(cfg.threads)
    device = resolve_device(cfg.device)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    model, tokenizer = build_policy(cfg, device)
    task = build_task(cfg)
    if not task.train:
        raise ValueError(f"task {task.name} has no training problems")
    engine = TorchEngine(
        model,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        dtype=DTYPES[cfg.engine_dtype] if cfg.engine_dtype else None,
        share_weights=cfg.engine_dtype is None,
        tokenizer=tokenizer,
    )
    ref_model = _frozen_copy(model) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        weight_decay=cfg.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup_steps))

    start = 0
    if resume:
        found = ckpt.latest_checkpoint(out)
        if found is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {ckpt.checkpoint_root(out)}")
        start = ckpt.restore(found, model=model, optimizer=optimizer, scheduler=scheduler)["step"]
        engine.update_weights(model)
        if ref_model is not None:
            raise NotImplementedError(
                "resuming a run with kl_coef > 0 needs the reference weights saved"
            )
    logger = MetricsLogger(
        out, resume_step=start, tensorboard=cfg.tensorboard, wandb=cfg.wandb, config=to_dict(cfg)
    )
    history: list[dict[str, Any]] = []
    prompt_cache = encode_prompts(tokenizer, [e.prompt for e in task.train])
    params = SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p
    )
    last = cfg.steps if cfg.stop_after is None else min(cfg.steps, start + cfg.stop_after)

    def run_eval(step: int) -> dict[str, float]:
        g = step_generator(cfg.seed, step, stream=3, device=engine.device)
        metrics = evaluate(
            engine,
            tokenizer,
            task.test,
            task.reward,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            generator=g,
        )
        record = {f"eval/{k}": v for k, v in metrics.items()}
        logger.log(step, record)
        history.append({"step": step, **record})
        return record

    final_eval: dict[str, float] = {}
    if start == 0 and cfg.eval_every > 0 and task.test:
        final_eval = run_eval(0)

    bar = _progress(cfg, start, last)
    for step in range(start, last):
        # 1. Rollout: prompts_per_step problems, group_size samples each, engine log-probs.
        t0 = time.perf_counter()
        idx = prompt_indices(len(task.train), step, cfg.prompts_per_step, cfg.seed)
        examples = [task.train[i] for i in idx]
        gen = step_generator(cfg.seed, step, stream=0, device=engine.device)
        rollout = engine.generate([prompt_cache[i] for i in idx], cfg.group_size, params, gen)
        rollout = _to_device(rollout, device)
        t_rollout = time.perf_counter() - t0

        # 2. Rewards and group-normalized advantages.
        texts = decode_completions(tokenizer, rollout.completion_ids, rollout.completion_mask)
        repeated = [examples[i] for i in rollout.prompt_index.tolist()]
        rewards_list, reward_errors = score(task.reward, texts, repeated)
        rewards = torch.tensor(rewards_list, dtype=torch.float64)  # [N]
        lengths = rollout.completion_lengths()  # [N]
        if cfg.overlong_buffer > 0:
            penalty = [
                overlong_penalty(int(n), cfg.max_new_tokens, cfg.overlong_buffer) for n in lengths
            ]
            rewards = rewards + torch.tensor(penalty, dtype=torch.float64)
        advantages = group_advantages(rewards, cfg.group_size, scale=cfg.advantage_scale).to(
            device
        )  # [N]

        # 3. Old log-probs: the engine's own (default) or a recompute pass of the trainer's model.
        t1 = time.perf_counter()
        old_logprobs, mismatch = _old_logprobs(cfg, model, rollout)  # [N, L]
        t_recompute = time.perf_counter() - t1

        # 4. num_minibatches optimizer steps over the rollout batch.
        t2 = time.perf_counter()
        train_metrics = update_policy(
            cfg, model, ref_model, optimizer, scheduler, rollout, old_logprobs, advantages, step
        )
        engine.update_weights(model)
        t_train = time.perf_counter() - t2

        # 5. Metrics.
        n_gen = int(lengths.sum())
        metrics = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std(correction=0)),
            "reward/errors": reward_errors,
            "response_length/mean": float(lengths.float().mean()),
            "response_length/max": int(lengths.max()),
            "response/truncated_fraction": sum(f == "length" for f in rollout.finish_reasons)
            / len(texts),
            **train_metrics,
            **mismatch,
            "lr": scheduler.get_last_lr()[0],
            "time/rollout_s": t_rollout,
            "time/recompute_s": t_recompute,
            "time/train_s": t_train,
            "throughput/tokens_per_s": n_gen / max(t_rollout + t_recompute + t_train, 1e-9),
        }
        logger.log(step + 1, metrics)
        history.append({"step": step + 1, **metrics})

        if (
            cfg.eval_every > 0
            and task.test
            and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps)
        ):
            final_eval = run_eval(step + 1)
            metrics.update(final_eval)
        if (
            cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0
        ) or step + 1 == last:
            ckpt.save_checkpoint(
                out,
                step + 1,
                model=model,
                tokenizer=tokenizer,
                optimizer=optimizer,
                scheduler=scheduler,
                config=to_dict(cfg),
                keep=cfg.keep_checkpoints,
            )
        if bar is not None:
            bar.update(1)
            bar.set_postfix(progress_postfix(metrics))
    if bar is not None:
        bar.close()
    logger.close()
    if last == cfg.steps:
        model.save_pretrained(out / "final", safe_serialization=True)
        tokenizer.save_pretrained(out / "final")
    return RunResult(out, history, final_eval, model, tokenizer)


def update_policy(
    cfg: TrainConfig,
    model,
    ref_model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    rollout: Rollout,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    step: int,
) -> dict[str, float]:
    """Split the rollout batch into ``num_minibatches`` shuffled minibatches, one optimizer step each.

    Inside a minibatch, micro-batches accumulate gradients; each gets the minibatch's global
    sequence and token counts as denominators, so the gradient equals one pass over the minibatch.
    """
    model.train()
    n = rollout.num_samples
    gen = step_generator(cfg.seed, step, stream=1, device=torch.device("cpu"))
    order = torch.randperm(n, generator=gen)
    minibatches = order.chunk(cfg.num_minibatches)
    micro = cfg.micro_batch_size or n
    acc = _Accumulator()
    constant = cfg.loss_constant or float(cfg.max_new_tokens)
    for k, mb in enumerate(minibatches):
        mask = rollout.completion_mask[mb]  # [n_mb, L]
        n_seq = int((mask.sum(dim=1) > 0).sum())
        n_tok = int(mask.sum())
        for part in mb.split(micro):
            logprobs, entropy = token_logprobs(
                model,
                rollout.prompt_ids[part],
                rollout.prompt_mask[part],
                rollout.completion_ids[part],
                rollout.completion_mask[part],
                temperature=cfg.temperature,
                with_entropy=True,
            )  # [n_micro, L] each
            ref = _ref_logprobs(cfg, ref_model, rollout, part)
            loss, metrics = policy_loss(
                cfg.algo,
                logprobs,
                old_logprobs[part].to(logprobs.dtype),
                advantages[part].to(logprobs.dtype),
                rollout.completion_mask[part],
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                aggregation=cfg.aggregation,
                num_sequences=max(n_seq, 1),
                num_tokens=max(n_tok, 1),
                constant=constant,
                ref_logprobs=ref,
                kl_coef=cfg.kl_coef,
            )
            loss.backward()
            m = rollout.completion_mask[part]
            tokens = int(m.sum())
            metrics["entropy"] = float((entropy.detach() * m).sum()) / max(tokens, 1)
            metrics["loss"] = float(loss.detach())
            acc.add(metrics, tokens, off_policy=k > 0)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            model.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        )
        acc.add_scalar("grad_norm", float(grad_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return acc.result()


def _old_logprobs(
    cfg: TrainConfig, model, rollout: Rollout
) -> tuple[torch.Tensor, dict[str, float]]:
    if cfg.old_logprobs == "engine":
        return rollout.logprobs, {}
    with torch.no_grad():
        recomputed, _ = token_logprobs(
            model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=cfg.temperature,
        )  # [N, L]
    mask = rollout.completion_mask.bool()
    diff = (recomputed - rollout.logprobs.to(recomputed.dtype)).abs()[mask]
    stats = {
        "mismatch/mean_abs": float(diff.mean()) if diff.numel() else 0.0,
        "mismatch/max_abs": float(diff.max()) if diff.numel() else 0.0,
    }
    return recomputed, stats


def _ref_logprobs(cfg: TrainConfig, ref_model, rollout: Rollout, part: torch.Tensor):
    if ref_model is None:
        return None
    with torch.no_grad():
        ref, _ = token_logprobs(
            ref_model,
            rollout.prompt_ids[part],
            rollout.prompt_mask[part],
            rollout.completion_ids[part],
            rollout.completion_mask[part],
            temperature=cfg.temperature,
        )
    return ref


def _frozen_copy(model):
    import copy

    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref


def _to_device(rollout: Rollout, device: torch.device) -> Rollout:
    if rollout.completion_ids.device == device:
        return rollout
    moved = {
        k: getattr(rollout, k).to(device)
        for k in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "logprobs",
            "prompt_index",
        )
    }
    return Rollout(finish_reasons=rollout.finish_reasons, extras=rollout.extras, **moved)


def _progress(cfg: TrainConfig, start: int, last: int):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=last - start, initial=0, desc=f"{cfg.algo}", unit="step", dynamic_ncols=True)


class _Accumulator:
    """Token-weighted means of micro-batch metrics (min/max for ratio extremes), all and off-policy."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}

    def _put(self, key: str, value: float, weight: float) -> None:
        if key.endswith("/min"):
            self.extremes[key] = min(self.extremes.get(key, math.inf), value)
        elif key.endswith("/max"):
            self.extremes[key] = max(self.extremes.get(key, -math.inf), value)
        else:
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def add(self, metrics: dict[str, float], tokens: int, *, off_policy: bool) -> None:
        for key, value in metrics.items():
            self._put(key, value, tokens)
            if off_policy and key.startswith(("clip/", "ratio/", "kl/old_new")):
                self._put(f"{key}_off_policy", value, tokens)

    def add_scalar(self, key: str, value: float) -> None:
        self._put(key, value, 1.0)

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}
        out.update(self.extremes)
        return out
