"""What the trainer calls for every task: one round of a step's episodes with their returns
(and, for multi-turn episodes, their advantages). Held-out evaluation, single- and multi-turn, is
:func:`gspo.orchestration.evaluation.evaluate` of ``eval_env`` within ``limits``.

A single-turn task is the one-turn case: its environment (:class:`SingleTurnEnv`, the run's
training reward with its format bonus, reward workers and timeout) ends every episode after
its first step, and the driver keeps the engine's rollout as it is; its advantages come from
the trainer's ``advantages`` step like every episode-level reward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gspo.config.combinations import multi_turn_combinations
from gspo.config.names import format_bonus_refusal
from gspo.envs.tasks.base import Example
from gspo.rollout.base import GenerationRequest, Rollout, RolloutBatch, SamplingParams

from .agent import episode_env
from .agent_driver import chain_advantages
from .base import Environment, SingleTurnEnv
from .credit import check_credit, turn_advantages
from .driver import Limits, answer_round, episode_metrics, run_episodes
from .rewards import reward_workers
from .trajectory import Trajectory, make_encoder

if TYPE_CHECKING:  # the config validates tasks against gspo.envs: only a type here, no cycle
    from gspo.config.options_task import TaskOptions
    from gspo.config.train import TrainConfig


def limits_from(cfg: TrainConfig, multi_turn: bool = True) -> Limits:
    """The run's episode limits; one-turn episodes: one turn of ``max_new_tokens``."""
    return episode_limits(cfg.task, cfg.rollout.max_new_tokens, multi_turn)


def episode_limits(task: TaskOptions, max_new_tokens: int, multi_turn: bool = True) -> Limits:
    """Episode limits from the task options (training's, ``gspo eval``'s and ``gspo sft``'s
    alike); one-turn episodes: one turn of ``max_new_tokens``."""
    if not multi_turn:
        n = max_new_tokens
        return Limits(max_turns=1, max_tokens_per_turn=n, max_total_tokens=n,
                      env_timeout_s=task.env_timeout_s)  # fmt: skip
    return Limits(
        max_turns=task.max_turns,
        max_tokens_per_turn=task.max_tokens_per_turn or max_new_tokens,
        max_total_tokens=task.max_total_tokens,
        env_timeout_s=task.env_timeout_s,
        episode_timeout_s=task.episode_timeout_s,
    )


class Episodes:
    """A run's episodes (single- or multi-turn; checks what multi-turn episodes cannot do up
    front). ``env`` is the task's environment. With ``train_reward`` (the trainer passes it for
    a task without a registered environment, whose ``env`` is the task's reward as a
    :class:`SingleTurnEnv`), training scores with it (the format bonus), the reward timeout and
    reward ``workers``, and evaluation (``eval_env``) with the task's reward alone."""

    def __init__(
        self,
        cfg: TrainConfig,
        env: Environment,
        tokenizer: Any,
        fmt: Any,
        *,
        train_reward: Any = None,
        workers: int = 1,
    ) -> None:
        # Agent environments (gspo.envs.agent) as environments, with their endpoint's address.
        env = episode_env(env, cfg.task.endpoint_host, cfg.task.endpoint_port)
        if env.multi_turn:
            check_multi_turn(cfg)
        bonus = cfg.reward.format_reward_weight
        if train_reward is None and bonus:  # the environment scores alone: no format bonus
            raise ValueError(format_bonus_refusal(env.name, bonus))
        self.eval_env = env
        self.own = train_reward is not None and type(env) is SingleTurnEnv
        if self.own:
            reward = train_reward
            self.eval_env = SingleTurnEnv(env.reward, env.name, workers=reward_workers(env.reward))
            env = SingleTurnEnv(
                reward,
                env.name,
                task_reward=None if reward is env.reward else env.reward,
                timeout_s=cfg.reward.reward_timeout_s or None,
                workers=workers,
            )
        self.cfg = cfg
        self.env = env
        self.encoder = make_encoder(tokenizer, fmt)
        self.limits = limits_from(cfg, env.multi_turn)
        self.stop_token_ids = tuple(fmt.stop_token_ids)
        # Agent episodes train every chain of calls, one row each, where a step's rows need
        # not be n per example (the modes below keep whole groups of n rows: last chain only).
        self.all_chains = (
            cfg.loss.credit == "episode"
            and not cfg.rollout.dynamic_sampling
            and cfg.asynchronous.max_staleness == 0
            and cfg.optim.minibatch_grouping == "shuffled"
        )

    def use_scorer(self, scorer: Any) -> None:
        """Score the task's rewards, in training and evaluation, with ``scorer``
        (:func:`gspo.envs.rewards.score_each`'s signature: ``RayScorer.each``); environments
        registered for the task keep their own scoring."""
        if self.own:
            self.env.scorer = self.eval_env.scorer = scorer

    def collect(
        self,
        engine,
        examples: list[Example],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        version: int,
        prompts: list[list[int]] | None = None,
        generate: Callable[[GenerationRequest], Rollout] | None = None,
    ) -> RolloutBatch:
        """``n`` episodes of each example (``prompts``: their ids, default the encoder's;
        ``generate`` runs each round instead of ``engine.generate``: the async producer's)."""
        rollout, trajs = run_episodes(
            engine, self.env, self.encoder, examples, n, params, self.limits, generator, version,
            generate=generate, prompts=prompts, all_chains=self.all_chains,
        )  # fmt: skip
        return self._collected(rollout, trajs, n)

    def score(self, rollout: Rollout, examples: list[Example]) -> RolloutBatch:
        """A one-turn rollout sampled elsewhere (the async rollout thread), answered by the
        environment as :meth:`collect` answers its own (row i*n + j: ``examples[i]``)."""
        if self.env.multi_turn:
            raise ValueError(f"{self.env.name}: only one-turn rollouts can be scored afterwards")
        trajs = answer_round(self.env, self.encoder.tokenizer, rollout, examples,
                             self.limits.env_timeout_s)  # fmt: skip
        return self._collected(rollout, trajs, 0)

    def _collected(self, rollout: Rollout, trajs: list[Trajectory], n: int) -> RolloutBatch:
        """The round scored: every episode's return (its turn rewards + final reward) as the
        reward, the task reward beside a format bonus when every episode has one, per-turn
        advantages with ``credit='turn'`` (else the trainer's group advantages of the returns:
        for one-turn episodes the same numbers)."""
        finals = [t.reward for t in trajs]
        turns = [t.turn_rewards for t in trajs]
        returns = torch.tensor(
            [sum(r) + f for r, f in zip(turns, finals, strict=True)], dtype=torch.float64
        )  # [N]
        # Failed episodes (an episode's chains are rows of one episode: counted once).
        errors = len({(k, None) if t.episode is None else (None, t.episode)
                      for k, t in enumerate(trajs) if t.finish == "failed"})  # fmt: skip
        task = None
        if all("task" in t.info for t in trajs):  # info["task"]: the reward without the bonus
            task = torch.tensor([t.info["task"] for t in trajs])  # [N]
        batch = RolloutBatch(rollout, returns, errors, task, trajectories=trajs)
        episodes = [t.episode for t in trajs]
        if None not in episodes and len(set(episodes)) < len(trajs):  # rows of every chain
            batch.advantages = chain_advantages(
                returns, episodes, n, self.cfg.loss.advantage_scale
            )  # [N]
        elif self.env.multi_turn and self.cfg.loss.credit == "turn":
            batch.advantages = turn_advantages(
                turns,
                finals,
                rollout.extras["turn_ids"],
                n,
                gamma=self.cfg.loss.turn_discount,
                scale=self.cfg.loss.advantage_scale,
            )  # [N, L]
        return batch

    def report(self, trajs: list[Trajectory]) -> dict[str, float]:
        """``episode/*`` metrics and ``reward/final_mean`` of multi-turn episodes ({} for
        one-turn episodes: a single-turn run logs what it always logged)."""
        if not self.env.multi_turn:
            return {}
        metrics = episode_metrics(trajs)
        metrics["reward/final_mean"] = sum(t.reward for t in trajs) / len(trajs)
        return metrics


def check_multi_turn(cfg: TrainConfig) -> None:
    """Refuse what multi-turn episodes do not support yet, before any work starts (the rules
    are the config's, :func:`gspo.config.combinations.multi_turn_combinations`)."""
    check_credit(cfg.loss.algo, cfg.loss.credit)
    problems = multi_turn_combinations(cfg)
    if problems:
        raise ValueError("; ".join(problems))


def make_episodes(
    cfg: TrainConfig, env: Environment, tokenizer: Any, fmt: Any, *, train_reward: Any = None,
    workers: int = 1,
) -> Episodes:  # fmt: skip
    """The episodes of a run, single- or multi-turn (one path through the trainer)."""
    return Episodes(cfg, env, tokenizer, fmt, train_reward=train_reward, workers=workers)
