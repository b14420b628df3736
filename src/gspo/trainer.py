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

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import checkpoint as ckpt
from . import moe
from .advantages import group_advantages
from .build import (
    DTYPES,
    build_policy,
    build_prompt_format,
    build_task,
    build_train_reward,
    context_length,
    count_unknown,
    decode_completions,
    limit_prompts,
    prompt_token_limit,
    resolve_device,
    set_threads,
)
from .config import MINIBATCH_GROUPINGS, TrainConfig, to_dict
from .dynamic_sampling import Sampled, fill_batch, round_generator, round_prompts
from .engine_config import build_engine, check_engine_available, close_engine
from .envs import env_for
from .envs.loop import make_episodes
from .evaluation import evaluate
from .logging import MetricsLogger, progress_postfix
from .losses import policy_loss
from .mismatch import correction_weights, mismatch_stats
from .models import save_model, token_logprobs
from .rewards import overlong_penalty, reward_workers, score, uses_sandbox
from .rollout.base import Rollout, SamplingParams
from .signals import SignalWatch
from .train_options import loss_kl_coef, loss_options, reward_kl_penalty, sequence_weights


class NonFiniteTrainingError(RuntimeError):
    """Raised after ``max_bad_steps`` consecutive steps of non-finite losses or gradients."""


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


def ensure_writable(path: Path) -> None:
    """Fail before any work if the output folder cannot be created or written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise PermissionError(
            f"output_dir {str(path)!r} is not writable: {exc.strerror or exc}"
        ) from None


def lr_lambda(warmup_steps: int):
    return lambda i: min(1.0, (i + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def train(cfg: TrainConfig, *, resume: bool = False) -> RunResult:
    """Run (or resume) the RL run described by ``cfg``."""
    check_engine_available(cfg)  # e.g. vLLM missing: say so before any work
    set_threads(cfg.threads)
    device = resolve_device(cfg.device)
    out = Path(cfg.output_dir)
    if resume:  # before any work: the checkpoint must belong to this run (gspo.resume)
        from .resume import check_changes, saved_config

        saved, _, found = saved_config(out)
        check_changes(saved, to_dict(cfg), str(found))
    ensure_writable(out)
    # The run's config at its root, so `gspo report` can group runs by algo and seed.
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    model, tokenizer = build_policy(cfg, device)
    task = build_task(cfg)
    if not task.train:
        raise ValueError(f"task {task.name} has no training problems")
    # Chat template (pretrained chat models) or raw prompts (tiny char models), its stop tokens.
    fmt = build_prompt_format(cfg, tokenizer, model)
    train_reward = build_train_reward(cfg, task)
    # Multi-turn tasks run episodes through gspo.envs (None: the batched single-turn path).
    episodes = make_episodes(cfg, env_for(task, cfg, fmt.chat), tokenizer, fmt)
    workers = reward_workers(train_reward, cfg.reward_workers)
    if uses_sandbox(train_reward):  # the startup line: which sandbox guarantees hold here
        from .sandbox import isolation

        print(isolation().summary(), file=sys.stderr, flush=True)
    # torch (shares the model unless engine_dtype) or vLLM (its own copy, synced every step).
    engine = build_engine(
        cfg,
        model,
        tokenizer,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        dtype=DTYPES[cfg.engine_dtype] if cfg.engine_dtype else None,
        share_weights=cfg.engine_dtype is None,
    )
    if engine.model is not None:  # an engine copy in float64 needs the eager experts
        moe.fit_experts_kernel(engine.model)
    ref_model = _frozen_copy(model) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        weight_decay=cfg.weight_decay,
        # One fused kernel instead of a dozen foreach ops per step: ~3-4x faster on CPU.
        fused=device.type in ("cpu", "cuda") or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.warmup_steps))

    start = 0
    bad_streak = 0  # consecutive steps whose every update was skipped as non-finite
    if resume:
        state = ckpt.restore(found, model=model, optimizer=optimizer, scheduler=scheduler)
        start, bad_streak = state["step"], state.get("bad_streak", 0)
        engine.update_weights(model)
        # ref_model (kl_coef > 0) was copied above from the freshly built initial policy, before
        # the restore, so it already holds the reference weights an unbroken run would use.
    logger = MetricsLogger(
        out, resume_step=start, tensorboard=cfg.tensorboard, wandb=cfg.wandb, config=to_dict(cfg)
    )
    history: list[dict[str, Any]] = []
    encoded = fmt.encode([e.prompt for e in task.train])
    # A prompt and its completion must fit the model's context (max_prompt_tokens 0: all of it).
    limit, named = prompt_token_limit(
        cfg.max_prompt_tokens, cfg.max_new_tokens, context_length(model)
    )
    kept, replaced, n_truncated, n_skipped = limit_prompts(
        encoded, limit, cfg.long_prompts, limit=named
    )
    if not kept:
        raise ValueError(f"no training problem has a prompt within {named}")
    train_set = [task.train[i] for i in kept]
    prompt_cache = [replaced.get(i, encoded[i]) for i in kept]
    # Held-out problems are scored whole: one over the limit stops the run ('error') or is left
    # out of the evaluation (counted).
    test_encoded = fmt.encode([e.prompt for e in task.test]) if task.test else []
    test_kept, *_ = limit_prompts(
        test_encoded,
        limit,
        "skip" if cfg.long_prompts != "error" else "error",
        limit=named,
        what="held-out problem",
    )
    test_set = [task.test[i] for i in test_kept]
    if start == 0:
        data = {
            "data/train_problems": len(train_set),
            "data/test_problems": len(test_set),
            "data/prompts_truncated": n_truncated,
            "data/prompts_skipped": n_skipped,
            "data/test_prompts_skipped": len(task.test) - len(test_set),
            "data/prompts_with_unknown_chars": count_unknown(tokenizer, encoded),
            "data/skipped_rows": len(task.skipped_rows),
        }
        logger.log(0, data)
        history.append({"step": 0, **data})
    params = SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        stop_token_ids=fmt.stop_token_ids,
    )
    last = cfg.steps if cfg.stop_after is None else min(cfg.steps, start + cfg.stop_after)

    def run_eval(step: int) -> dict[str, float]:
        g = step_generator(cfg.seed, step, stream=3, device=engine.device)
        metrics = (
            episodes.evaluate(engine, test_set)
            if episodes
            else evaluate(
                engine,
                tokenizer,
                test_set,
                task.reward,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                generator=g,
                prompt_format=fmt,
            )
        )
        record = {f"eval/{k}": v for k, v in metrics.items()}
        logger.log(step, record)
        history.append({"step": step, **record})
        return record

    final_eval: dict[str, float] = {}
    if start == 0 and cfg.eval_every > 0 and test_set:
        final_eval = run_eval(0)

    def sample_step(step: int):
        """Single-turn rollout and rewards of one step (more rounds with dynamic sampling):
        (rollout, rewards [N], reward errors, reward metrics, rollout seconds)."""
        t_generate = [0.0]  # rollout time of every round (rewards excluded, as without rounds)

        def sample_round(k: int) -> Sampled:
            """Round k of the step's sampling (k > 0 only with dynamic sampling)."""
            if k == 0:
                idx = prompt_indices(len(train_set), step, cfg.prompts_per_step, cfg.seed)
                gen = step_generator(cfg.seed, step, stream=0, device=engine.device)
            else:
                idx = round_prompts(len(train_set), cfg.prompts_per_step, cfg.seed, step, k)
                gen = round_generator(cfg.seed, step, k, engine.device)
            examples = [train_set[i] for i in idx]
            # MoE models: the engine's expert choices (prefill + decode) land in rollout.extras
            # ("routing", replayed by routing_replay='engine'); dense models: engine.generate.
            t0 = time.perf_counter()
            rollout = moe.generate_with_routing(
                engine, [prompt_cache[i] for i in idx], cfg.group_size, params, gen
            )
            rollout = _to_device(rollout, device)
            t_generate[0] += time.perf_counter() - t0
            # 2. Rewards.
            texts = decode_completions(tokenizer, rollout.completion_ids, rollout.completion_mask)
            repeated = [examples[i] for i in rollout.prompt_index.tolist()]
            rewards_list, reward_errors = score(
                train_reward,
                texts,
                repeated,
                timeout_s=cfg.reward_timeout_s or None,
                workers=workers,
            )
            rewards = torch.tensor(rewards_list, dtype=torch.float64)  # [N]
            task_rewards = None
            if train_reward is not task.reward:  # a format bonus is on: log the task reward
                task_rewards = torch.tensor(
                    score(task.reward, texts, repeated, workers=workers)[0]
                )  # [N]
            if cfg.overlong_buffer > 0:
                penalty = [
                    overlong_penalty(int(n), cfg.max_new_tokens, cfg.overlong_buffer)
                    for n in rollout.completion_lengths()
                ]
                rewards = rewards + torch.tensor(penalty, dtype=torch.float64)
            return Sampled(rollout, rewards, reward_errors, task_rewards)

        if cfg.dynamic_sampling:  # DAPO: only groups whose rewards differ, more rounds if needed
            batch, sampling_metrics = fill_batch(
                sample_round,
                target_groups=cfg.prompts_per_step,
                group_size=cfg.group_size,
                max_rounds=cfg.dynamic_sampling_rounds,
                pad_id=tokenizer.pad_token_id,
                groups_multiple=cfg.num_minibatches if cfg.minibatch_grouping == "groups" else 1,
                step=step,
            )
        else:
            batch, sampling_metrics = sample_round(0), {}
        rollout, rewards, reward_errors = batch.rollout, batch.rewards, batch.reward_errors
        extra_rewards: dict[str, float] = dict(sampling_metrics)
        if batch.task_rewards is not None:
            extra_rewards["reward/task"] = float(batch.task_rewards.float().mean())
        return rollout, rewards, reward_errors, extra_rewards, t_generate[0]

    bar = _progress(cfg, start, last)
    # One warning per run when most responses hit max_new_tokens or most advantages are 0.
    watch = SignalWatch(cfg.max_new_tokens, echo=_echo(bar))
    for step in range(start, last):
        # 1. Rollout: prompts_per_step problems, group_size samples each, engine log-probs.
        if episodes is not None:  # multi-turn: returns, [N] or [N, L] advantages, episode/*
            t0 = time.perf_counter()
            idx = prompt_indices(len(train_set), step, cfg.prompts_per_step, cfg.seed)
            examples = [train_set[i] for i in idx]
            gen = step_generator(cfg.seed, step, stream=0, device=engine.device)
            rollout, rewards, advantages, extra_rewards = episodes.collect(
                engine, examples, cfg.group_size, params, gen, version=step
            )
            rollout, advantages = _to_device(rollout, device), advantages.to(device)
            t_rollout = time.perf_counter() - t0
            reward_errors = int(extra_rewards["episode/failed"])
        else:
            rollout, rewards, reward_errors, extra_rewards, t_rollout = sample_step(step)
            advantages = None  # group-normalized below, after the optional KL-in-reward term
        lengths = rollout.completion_lengths()  # [N] policy tokens

        # 3. Old log-probs: the engine's own (default) or a recompute pass of the trainer's model.
        t1 = time.perf_counter()
        old_logprobs, mismatch = _old_logprobs(cfg, model, rollout)  # [N, L]
        # Decoupled objective (mismatch_correction): weights pi_trainer / pi_engine, capped.
        weights, corrected = correction_weights(
            cfg, old_logprobs, rollout.logprobs, rollout.policy_mask
        )  # [N, L] or [N] or None
        t_recompute = time.perf_counter() - t1
        # Group-normalized advantages (of the reward less β Σ_t KL_t with kl_in_reward).
        if advantages is None:
            kl_penalty, kl_metrics = reward_kl_penalty(cfg, ref_model, rollout, old_logprobs)
            shaped = rewards if kl_penalty is None else rewards - kl_penalty  # [N]
            advantages = group_advantages(shaped, cfg.group_size, scale=cfg.advantage_scale)
            advantages = advantages.to(device)  # [N]
            extra_rewards.update(kl_metrics)

        # 4. num_minibatches optimizer steps over the rollout batch.
        t2 = time.perf_counter()
        train_metrics = update_policy(
            cfg,
            model,
            ref_model,
            optimizer,
            scheduler,
            rollout,
            old_logprobs,
            advantages,
            step,
            weights=weights,
        )
        t_train = time.perf_counter() - t2
        t3 = time.perf_counter()
        engine.update_weights(model)  # torch engine sharing the model: nothing to copy
        t_sync = time.perf_counter() - t3
        t_train += t_sync  # time/train_s keeps its meaning (update + sync), as before
        # MoE: share of expert choices the update changed, on this rollout ({} for dense models).
        moe_metrics = moe.step_metrics(model, rollout)
        bad_streak = (
            bad_streak + 1 if train_metrics["faults/skipped_updates"] >= cfg.num_minibatches else 0
        )

        # 5. Metrics.
        n_gen = int(lengths.sum())
        metrics = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std(correction=0)),
            "reward/errors": reward_errors,
            **extra_rewards,
            "response_length/mean": float(lengths.float().mean()),
            "response_length/max": int(lengths.max()),
            "response/truncated_fraction": sum(f == "length" for f in rollout.finish_reasons)
            / len(rollout.finish_reasons),
            **train_metrics,
            **mismatch,
            **corrected,
            **moe_metrics,
            "lr": scheduler.get_last_lr()[0],
            "time/rollout_s": t_rollout,
            "time/recompute_s": t_recompute,
            "time/train_s": t_train,
            "time/weight_sync_s": t_sync,
            "throughput/tokens_per_s": n_gen / max(t_rollout + t_recompute + t_train, 1e-9),
        }
        logger.log(step + 1, metrics)
        history.append({"step": step + 1, **metrics})
        watch.update(
            step + 1,
            metrics["response/truncated_fraction"],
            metrics.get("advantage/zero_fraction", 0.0),
            metrics["reward/mean"],
        )
        if bad_streak >= cfg.max_bad_steps:
            logger.close()
            close_engine(engine)
            raise NonFiniteTrainingError(
                f"step {step + 1}: {bad_streak} consecutive steps had only non-finite losses or "
                f"gradients (every update skipped); stopping. Last good checkpoint: "
                f"{ckpt.latest_checkpoint(out)}. Lower the learning rate or check the rewards and "
                "log-probs (metrics.jsonl has faults/skipped_updates per step)."
            )

        if (
            cfg.eval_every > 0
            and test_set
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
                extra={"bad_streak": bad_streak},  # a resumed run continues the count
            )
        if bar is not None:
            bar.update(1)
            bar.set_postfix(progress_postfix(metrics))
    if bar is not None:
        bar.close()
    logger.close()
    close_engine(engine)  # vLLM: shut its engine down (the torch engine has nothing to close)
    if last == cfg.steps:
        save_model(model, tokenizer, out / "final")  # LoRA: merged, adapter in final/adapter
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
    weights: torch.Tensor | None = None,
    shard: tuple[int, int] | None = None,
) -> dict[str, float]:
    """Split the rollout batch into ``num_minibatches`` minibatches (``minibatch_rows``), one
    optimizer step each.

    Inside a minibatch, micro-batches accumulate gradients; each gets the minibatch's global
    sequence and token counts as denominators, so the gradient equals one pass over the minibatch.
    """
    model.train()
    n = rollout.num_samples
    gen = step_generator(cfg.seed, step, stream=1, device=torch.device("cpu"))
    minibatches = minibatch_rows(
        n, cfg.group_size, cfg.num_minibatches, cfg.minibatch_grouping, gen
    )
    micro = cfg.micro_batch_size or n
    # MoE routing records (replay, aux loss) are laid out over the rollout's full width.
    trim = not moe.is_moe(model)
    acc = _Accumulator()
    constant = cfg.loss_constant or float(cfg.max_new_tokens)
    # MoE Routing Replay: the expert choice recorded by the old pass (R2) or the engine (R3).
    replay = moe.replay_source(cfg.routing_replay, rollout, model)
    idle = zero_gradient_rows(cfg, model, advantages)  # [N] rows that only need metrics
    acc.add_scalar("advantage/zero_fraction", float(_zero_advantage(advantages).float().mean()))
    for k, mb in enumerate(minibatches):
        mask = rollout.policy_mask[mb]  # [n_mb, L] policy tokens only (multi-turn: no env)
        n_seq = int((mask.sum(dim=1) > 0).sum())
        n_tok = int(mask.sum())
        if shard is not None:  # data-parallel rank (rank, world): its rows, global denominators
            mb = mb[shard[0] :: shard[1]]
        mb_loss = 0.0  # micro-batch losses are parts of the minibatch loss: they add up
        # Rows with a gradient first; the idle ones run a no-grad forward for their metrics
        # (or nothing, with zero_advantage_metrics off: they add 0 to the loss either way).
        # A few idle rows stay in the gradient pass: a second forward costs more than they do.
        live, rest = mb[~idle[mb]], mb[idle[mb]]
        if cfg.zero_advantage_metrics and len(rest) < cfg.zero_advantage_split * len(mb):
            live, rest = mb, mb[:0]
        parts = [(p, True) for p in live.split(micro) if len(p)]
        if cfg.zero_advantage_metrics:
            parts += [(p, False) for p in rest.split(micro) if len(p)]  # (empty split: [[]])
        if len(live) == 0:
            _zero_grads(model)  # the update a zero gradient gives: Adam's moments still move
        for part, needs_grad in parts:
            rows = _rows(rollout, part, trim)  # this micro-batch's rows, padding columns cut
            # MoE: replay/capture the routing of this forward (a no-op block for dense models).
            with (
                torch.set_grad_enabled(needs_grad),
                moe.training_forward(model, replay, part, aux=True) as routes,
            ):
                logprobs, entropy = token_logprobs(
                    model,
                    *rows.tensors,
                    temperature=cfg.temperature,
                    with_entropy=True,
                    prompt_index=rollout.prompt_index[part],  # a group's prompt runs once
                )  # [n_micro, L'] each
            ref = _ref_logprobs(cfg, ref_model, rows, rollout.prompt_index[part])
            # Off-policy sequence mask against the engine's log-probs (None unless enabled).
            keep, opsm = sequence_weights(
                cfg,
                logprobs,
                rollout.logprobs[part][:, rows.completion_cols],
                advantages[part],
                rows.loss_mask,
            )
            loss, metrics = policy_loss(
                cfg.algo,
                logprobs,
                old_logprobs[part][:, rows.completion_cols].to(logprobs.dtype),
                _columns(advantages[part], rows.completion_cols).to(logprobs.dtype),
                rows.loss_mask,
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                aggregation=cfg.aggregation,
                num_sequences=max(n_seq, 1),
                num_tokens=max(n_tok, 1),
                constant=constant,
                ref_logprobs=ref,
                kl_coef=loss_kl_coef(cfg),
                kl_estimator=cfg.kl_estimator,
                weights=_product(keep, _part_weights(weights, part, rows.completion_cols)),
                options=loss_options(cfg),
            )
            metrics.update(opsm)
            aux, moe_metrics = moe.micro_batch_terms(
                model,
                routes,
                rollout,
                part,
                aux_coef=cfg.router_aux_loss_coef,
                weight=len(part) / len(mb),
            )
            if aux is not None:
                loss = loss + aux  # load-balancing loss (router_aux_loss_coef > 0)
            metrics.update(moe_metrics)
            if needs_grad:
                loss.backward()
            m = rows.loss_mask  # [n_micro, L']
            tokens = int(m.sum())
            metrics["entropy"] = float((entropy.detach() * m).sum()) / max(tokens, 1)
            mb_loss += float(loss.detach())
            acc.add(metrics, tokens, int(m.any(dim=1).sum()), off_policy=k > 0)
        acc.add_scalar("loss", mb_loss)  # mean over minibatches
        grad_norm = torch.nn.utils.clip_grad_norm_(
            model.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
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


def zero_gradient_rows(cfg: TrainConfig, model, advantages: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows whose loss term and gradient are exactly 0, so they need no backward.

    A row whose advantage is 0 at every token adds 0 * ratio to the objective (clipped or not),
    so its gradient is 0 (group-normalized advantages are 0 for every row of a group whose
    rewards all agree: common on a mostly solved or mostly failed task). Not so with a KL
    penalty (its gradient reaches every row) or for MoE models (the load-balancing loss and the
    routing records span the whole forward), where every row keeps its backward.
    """
    if cfg.kl_coef != 0.0 or moe.is_moe(model):
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
    if cfg.old_logprobs == "engine":
        return rollout.logprobs, {}
    # MoE: the same pass records the pre-update policy's routing (what R2 replays).
    with torch.no_grad(), moe.capture_routing(model) as routes:
        recomputed, _ = token_logprobs(
            model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=cfg.temperature,
            prompt_index=rollout.prompt_index,
        )  # [N, L]
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


def _ref_logprobs(cfg: TrainConfig, ref_model, rows: _Rows, prompt_index: torch.Tensor):
    if ref_model is None:
        return None
    with torch.no_grad():
        ref, _ = token_logprobs(
            ref_model, *rows.tensors, temperature=cfg.temperature, prompt_index=prompt_index
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
    if rollout.loss_mask is not None:
        moved["loss_mask"] = rollout.loss_mask.to(device)
    return Rollout(finish_reasons=rollout.finish_reasons, extras=rollout.extras, **moved)


def _echo(bar):
    """Print to stderr, above the progress bar when there is one."""
    import sys

    if bar is None:
        return lambda message: print(message, file=sys.stderr, flush=True)
    return lambda message: bar.write(message, file=sys.stderr)


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
        self.totals: dict[str, float] = {}

    def _put(self, key: str, value: float, weight: float) -> None:
        base = key.removesuffix("_off_policy")  # ratio/min_off_policy is an extreme too
        if base.endswith("/min"):
            self.extremes[key] = min(self.extremes.get(key, math.inf), value)
        elif base.endswith("/max"):
            self.extremes[key] = max(self.extremes.get(key, -math.inf), value)
        else:
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def add(
        self, metrics: dict[str, float], tokens: int, sequences: int, *, off_policy: bool
    ) -> None:
        # Each metric is pooled over what it averages: ratio/mean over its ratios (sequences for
        # the GSPO family, tokens for GRPO), clip/seq_fraction over sequences, the rest tokens.
        weights = {"ratio/mean": metrics.pop("ratio/count", tokens), "clip/seq_fraction": sequences}
        for key, value in metrics.items():
            weight = weights.get(key, tokens)
            self._put(key, value, weight)
            if off_policy and key.startswith(("clip/", "ratio/", "kl/old_new")):
                self._put(f"{key}_off_policy", value, weight)

    def add_scalar(self, key: str, value: float, reduce: str = "mean") -> None:
        if reduce == "sum":
            self.totals[key] = self.totals.get(key, 0.0) + value
        else:
            self._put(key, value, 1.0)

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}
        out.update(self.extremes)
        out.update(self.totals)
        return out
