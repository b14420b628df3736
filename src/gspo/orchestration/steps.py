"""The named steps of one RL step; the loop (``orchestration.loop``) calls them in order.

    collect (rollout + score) ─► old_logprobs ─► advantages ─► update ─► sync
        ─► step_metrics ─► evaluate ─► checkpoint

Each takes the run's :class:`Parts` and the step's :class:`~gspo.rollout.base.RolloutBatch`
(one object from the rollout through the update) and can be opened and tested alone. The
algorithm enters only through the backend's update (the loss registry). What they work on is
here too: the built parts of a run (:class:`Parts`) and the loop's per-step state
(:class:`StepState`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gspo.config.train import TrainConfig

from ..backend.base import CheckpointTarget, TrainingBackend
from ..backend.options import correction_weights
from ..config.fields import to_dict
from ..core.losses import group_advantages
from ..core.seeding import prompt_indices, step_generator
from ..envs.episodes import Episodes
from ..envs.rewards import overlong_penalty
from ..envs.tasks.base import Example, Task
from ..rollout.base import RolloutBatch, SamplingParams
from .dynamic_sampling import fill_batch, round_generator, round_prompts
from .evaluation import evaluate


@dataclass
class StepState:
    """The loop's own state between steps; a checkpoint saves it whole and a resume restores it.

    The RNG streams need no saved state: every random choice of step k (prompts, samples,
    minibatches, evaluation) comes from a generator seeded by (seed, k, stream), so a resumed
    run replays exactly what an unbroken run would do.
    """

    seed: int
    step: int = 0
    """RL steps (rollout + update) done so far."""
    bad_streak: int = 0
    """Consecutive steps whose every update was skipped as non-finite."""

    def generator(self, stream: int, device: torch.device) -> torch.Generator:
        """The step's generator for ``stream`` (0 sampling, 1 minibatches, 3 evaluation)."""
        return step_generator(self.seed, self.step, stream=stream, device=device)

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint's ``extra`` (``step`` is saved by the checkpoint itself)."""
        return {k: v for k, v in asdict(self).items() if k != "step"}

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any], seed: int) -> StepState:
        # bad_streak: older checkpoints have no count; seed: the config's (checked on resume).
        return cls(seed=seed, step=int(saved["step"]), bad_streak=int(saved.get("bad_streak", 0)))


@dataclass
class Parts:
    """A run's parts, built from the config by the composition root (``gspo.compose.train``)."""

    cfg: TrainConfig
    """The run's config, one object per component (``cfg.loss``, ``cfg.rollout``, ...)."""
    backend: TrainingBackend
    engine: Any
    """The rollout engine (``gspo.rollout.base``): torch, vLLM, or a pool of workers."""
    tokenizer: Any
    fmt: Any
    """The prompt format (chat template or raw prompt) and its stop tokens."""
    task: Task
    train_reward: Any
    """The training reward (the task reward, with a format bonus when one is on)."""
    train_set: list[Example]
    prompt_cache: list[list[int]]
    """Token ids of each training prompt (truncated or replaced where too long)."""
    test_set: list[Example]
    params: SamplingParams
    episodes: Episodes
    """The task's episodes through the environment driver (single-turn tasks: one turn)."""
    reward_workers: int
    device: torch.device
    output_dir: Path
    data_metrics: dict[str, float] = field(default_factory=dict)
    """``data/*`` counts logged at step 0."""
    scorer: Any = None
    """Rewards on Ray tasks (``orchestration.ray_rewards.RayScorer``; the task's environment
    scores with its ``each``, :meth:`Episodes.use_scorer`); None: in this process."""
    source: Any = None
    """Where each step's scored batch comes from (``orchestration.loop.BatchSource``): the
    synchronous source, or the async one when max_staleness >= 1; None: synchronous."""


def collect(parts: Parts, state: StepState) -> RolloutBatch:
    """1-2. Rollout and rewards of the step: every task's episodes through the environment
    driver (``parts.episodes``; one turn each for single-turn tasks), in more than one round
    with dynamic sampling. ``time/rollout_s`` covers the rounds' sampling and scoring."""
    cfg = parts.cfg
    t0 = time.perf_counter()
    rounds: list[RolloutBatch] = []

    def sample_round(k: int) -> RolloutBatch:
        rounds.append(sampled(parts, episodes_round(parts, state, k)))
        return rounds[-1]

    if (
        cfg.rollout.dynamic_sampling
    ):  # DAPO: only groups whose rewards differ, more rounds if needed
        batch, metrics = fill_batch(
            sample_round,
            target_groups=cfg.rollout.prompts_per_step,
            group_size=cfg.rollout.group_size,
            max_rounds=cfg.rollout.dynamic_sampling_rounds,
            pad_id=parts.tokenizer.pad_token_id,
            groups_multiple=cfg.optim.num_minibatches
            if cfg.optim.minibatch_grouping == "groups"
            else 1,
            step=state.step,
        )
    else:
        batch, metrics = sample_round(0), {}
    reward_metrics: dict[str, float] = dict(metrics)
    if batch.task_rewards is not None:
        reward_metrics["reward/task"] = float(batch.task_rewards.float().mean())
    # episode/* of every episode the step sampled (multi-turn; none for one-turn episodes)
    reward_metrics.update(parts.episodes.report([t for r in rounds for t in r.trajectories]))
    # Per-turn credit [N, L] came with the episodes (one round: no dynamic sampling).
    batch.metrics = reward_metrics
    batch.times["rollout"] = time.perf_counter() - t0
    return batch


def episodes_round(parts: Parts, state: StepState, k: int) -> RolloutBatch:
    """Round k of the step's sampling (k > 0 only with dynamic sampling): group_size episodes
    of prompts_per_step problems, from their cached prompt ids, with the step's generator."""
    cfg, engine = parts.cfg, parts.engine
    if k == 0:
        idx = prompt_indices(
            len(parts.train_set), state.step, cfg.rollout.prompts_per_step, cfg.run.seed
        )
        gen = state.generator(0, engine.device)
    else:
        idx = round_prompts(
            len(parts.train_set), cfg.rollout.prompts_per_step, cfg.run.seed, state.step, k
        )
        gen = round_generator(cfg.run.seed, state.step, k, engine.device)
    got = parts.episodes.collect(
        engine,
        [parts.train_set[i] for i in idx],
        cfg.rollout.group_size,
        parts.params,
        gen,
        version=state.step,
        prompts=[parts.prompt_cache[i] for i in idx],
    )
    return got.to(parts.device)


def sampled(parts: Parts, got: RolloutBatch) -> RolloutBatch:
    """A round as dynamic sampling sees it: the training reward is the episode's return, less
    the overlong penalty (single-turn tasks)."""
    cfg, rewards = parts.cfg, got.rewards  # [N] float64 returns
    if cfg.rollout.overlong_buffer > 0:
        penalty = [
            overlong_penalty(int(n), cfg.rollout.max_new_tokens, cfg.rollout.overlong_buffer)
            for n in got.rollout.completion_lengths()
        ]
        rewards = rewards + torch.tensor(penalty, dtype=torch.float64)  # [N]
    got.rewards = rewards
    return got


def score_round(parts: Parts, rollout, examples: list) -> RolloutBatch:
    """Rewards of a one-turn rollout sampled elsewhere (the async rollout thread): the task's
    environment answers it as in :func:`collect`."""
    return sampled(parts, parts.episodes.score(rollout, examples))


def old_logprobs(parts: Parts, batch: RolloutBatch) -> None:
    """3. Old log-probs: the engine's own (default) or a recompute pass of the trainer's model,
    and the decoupled objective's weights pi_trainer / pi_engine (mismatch_correction)."""
    t0 = time.perf_counter()
    rollout = batch.rollout
    batch.old_logprobs, batch.mismatch = parts.backend.old_logprobs(rollout)  # [N, L]
    batch.weights, batch.corrected = correction_weights(
        parts.cfg.loss, batch.old_logprobs, rollout.logprobs, rollout.policy_mask
    )  # [N, L] or [N] or None
    batch.times["recompute"] = time.perf_counter() - t0


def advantages(parts: Parts, batch: RolloutBatch) -> None:
    """Group-normalized advantages of the reward (less β Σ_t KL_t with kl_in_reward), unless
    the episodes gave per-turn ones."""
    if batch.advantages is not None:
        return
    penalty, kl_metrics = parts.backend.kl_penalty(batch.rollout, batch.old_logprobs)
    shaped = batch.rewards if penalty is None else batch.rewards - penalty  # [N]
    adv = group_advantages(
        shaped, parts.cfg.rollout.group_size, scale=parts.cfg.loss.advantage_scale
    )
    batch.advantages = adv.to(parts.device)  # [N]
    batch.metrics.update(kl_metrics)


def update(parts: Parts, state: StepState, batch: RolloutBatch) -> dict[str, float]:
    """4. num_minibatches optimizer steps over the batch (the backend: local or FSDP2 ranks)."""
    t0 = time.perf_counter()
    batch.step = state.step  # seeds the update's minibatch shuffle
    metrics = parts.backend.update(batch)
    batch.times["update"] = time.perf_counter() - t0
    return metrics


def sync(parts: Parts, batch: RolloutBatch) -> None:
    """5. The new weights to the rollout engine(s) (a torch engine sharing the model: none)."""
    t0 = time.perf_counter()
    parts.backend.push_weights(parts.engine)
    batch.times["sync"] = time.perf_counter() - t0


def step_metrics(
    parts: Parts,
    batch: RolloutBatch,
    train_metrics: dict[str, float],
    policy_metrics: dict[str, float],
) -> dict[str, Any]:
    """6. The step's metrics record (the order is the order of metrics.jsonl)."""
    rollout, rewards, times = batch.rollout, batch.rewards, batch.times
    lengths = rollout.completion_lengths()  # [N] policy tokens
    t_train = times["update"] + times["sync"]  # time/train_s: update + sync, as always
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(correction=0)),
        "reward/errors": batch.reward_errors,
        **batch.metrics,
        "response_length/mean": float(lengths.float().mean()),
        "response_length/max": int(lengths.max()),
        "response/truncated_fraction": sum(f == "length" for f in rollout.finish_reasons)
        / len(rollout.finish_reasons),
        **train_metrics,
        **batch.mismatch,
        **batch.corrected,
        **policy_metrics,
        "lr": parts.backend.lr(),
        "time/rollout_s": times["rollout"],
        "time/recompute_s": times["recompute"],
        "time/train_s": t_train,
        "time/weight_sync_s": times["sync"],
        "throughput/tokens_per_s": int(lengths.sum())
        / max(times["rollout"] + times["recompute"] + t_train, 1e-9),
    }


def evaluate_now(parts: Parts, state: StepState) -> dict[str, float]:
    """7. Held-out evaluation at ``state.step``, as ``eval/*`` metrics: the one evaluation of
    ``gspo eval`` and ``gspo sft`` too, of the task's environment (``episodes.eval_env``):
    greedy whole episodes for multi-turn tasks (sampled ones are ``gspo eval --samples``);
    greedy and sampled one-turn episodes for single-turn tasks."""
    cfg, engine, episodes = parts.cfg, parts.engine, parts.episodes
    metrics = evaluate(
        engine,
        parts.tokenizer,
        parts.test_set,
        parts.task.reward,
        max_new_tokens=cfg.rollout.max_new_tokens,
        samples=0 if episodes.eval_env.multi_turn else 1,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        generator=state.generator(3, engine.device),
        prompt_format=parts.fmt,
        env=episodes.eval_env,
        limits=episodes.limits,
    )
    return {f"eval/{k}": v for k, v in metrics.items()}


def eval_due(parts: Parts, state: StepState) -> bool:
    cfg = parts.cfg
    return (
        cfg.run.eval_every > 0
        and bool(parts.test_set)
        and (state.step % cfg.run.eval_every == 0 or state.step == cfg.run.steps)
    )


def checkpoint(parts: Parts, state: StepState, last: int, *, force: bool = False) -> bool:
    """8. The resumable checkpoint every checkpoint_every steps, at the run's last step, and
    when ``force`` (a stop was requested: SIGINT / SIGTERM); whether one was written."""
    cfg = parts.cfg
    due = cfg.run.checkpoint_every > 0 and state.step % cfg.run.checkpoint_every == 0
    if due or state.step == last or force:
        config = to_dict(cfg)
        target = CheckpointTarget(
            parts.output_dir, parts.tokenizer, config, cfg.run.keep_checkpoints
        )
        # The loop's state: a resumed run continues the bad-step count.
        parts.backend.save_checkpoint(target, state.step, state.to_checkpoint())
        return True
    return False
