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
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gspo import checkpoint as ckpt
from gspo import moe
from gspo.backend.update import (
    _frozen_copy,
    _old_logprobs,
    _to_device,
    lr_lambda,
    update_policy,
)
from gspo.build import (
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
from gspo.config import TrainConfig, to_dict
from gspo.core.advantages import group_advantages
from gspo.core.mismatch import correction_weights
from gspo.core.seeding import prompt_indices, step_generator
from gspo.dynamic_sampling import Sampled, fill_batch, round_generator, round_prompts
from gspo.engine_config import build_engine, check_engine_available, close_engine
from gspo.envs import env_for
from gspo.envs.loop import make_episodes
from gspo.envs.rewards import overlong_penalty, reward_workers, score, uses_sandbox
from gspo.logging import MetricsLogger, progress_postfix
from gspo.models import save_model
from gspo.orchestration.evaluation import evaluate
from gspo.rollout.base import SamplingParams
from gspo.signals import SignalWatch
from gspo.train_options import reward_kl_penalty


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


def train(cfg: TrainConfig, *, resume: bool = False) -> RunResult:
    """Run (or resume) the RL run described by ``cfg``."""
    check_engine_available(cfg)  # e.g. vLLM missing: say so before any work
    set_threads(cfg.threads)
    device = resolve_device(cfg.device)
    out = Path(cfg.output_dir)
    if resume:  # before any work: the checkpoint must belong to this run (gspo.resume)
        from gspo.resume import check_changes, saved_config

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
        from gspo.sandbox import isolation

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
