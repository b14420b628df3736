"""What the trainer calls for a multi-turn task: one step's episodes with rewards and
advantages, and the held-out evaluation of whole episodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gspo.core.metrics import CORRECT, mean_and_se
from gspo.envs.tasks.base import Example
from gspo.rollout.base import Rollout, SamplingParams

from .base import Environment
from .credit import check_credit, episode_advantages, turn_advantages
from .driver import Limits, episode_metrics, run_episodes
from .trajectory import make_encoder


def limits_from(cfg: Any) -> Limits:
    return Limits(
        max_turns=cfg.max_turns,
        max_tokens_per_turn=cfg.max_tokens_per_turn or cfg.max_new_tokens,
        max_total_tokens=cfg.max_total_tokens,
        env_timeout_s=cfg.env_timeout_s,
    )


class Episodes:
    """Multi-turn rollouts for the trainer (checks the credit/algorithm pairing up front)."""

    def __init__(self, cfg: Any, env: Environment, tokenizer: Any, fmt: Any) -> None:
        check_credit(cfg.algo, cfg.credit)
        if cfg.max_turns < 1 or cfg.max_total_tokens < 1:
            raise ValueError("max_turns and max_total_tokens must be >= 1")
        if cfg.overlong_buffer > 0:
            raise ValueError("overlong_buffer applies to single-turn tasks only")
        for name in ("dynamic_sampling", "kl_in_reward", "off_policy_mask"):
            if getattr(cfg, name, False):
                raise ValueError(f"{name} applies to single-turn tasks only (for now)")
        if cfg.routing_replay == "engine":
            raise ValueError(
                "routing_replay='engine' needs the engine's expert choices, which multi-turn "
                "episodes do not record yet (use 'old' or none)"
            )
        self.cfg = cfg
        self.env = env
        self.encoder = make_encoder(tokenizer, fmt)
        self.limits = limits_from(cfg)
        self.stop_token_ids = tuple(fmt.stop_token_ids)

    def collect(
        self,
        engine,
        examples: list[Example],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        version: int,
        generate: Callable[..., Rollout] | None = None,
    ) -> tuple[Rollout, torch.Tensor, torch.Tensor, dict[str, float]]:
        """(rollout, episode returns [N], advantages [N] or [N, L], episode metrics);
        ``generate`` runs each round instead of ``engine.generate`` (the async producer's)."""
        rollout, trajs = run_episodes(
            engine,
            self.env,
            self.encoder,
            examples,
            n,
            params,
            self.limits,
            generator,
            version,
            generate=generate,
        )
        finals = [t.reward for t in trajs]
        turns = [t.turn_rewards for t in trajs]
        returns = torch.tensor(
            [sum(r) + f for r, f in zip(turns, finals, strict=True)], dtype=torch.float64
        )
        scale = self.cfg.advantage_scale
        if self.cfg.credit == "turn":
            advantages = turn_advantages(
                turns,
                finals,
                rollout.extras["turn_ids"],
                n,
                gamma=self.cfg.turn_discount,
                scale=scale,
            )  # [N, L]
        else:
            advantages = episode_advantages(turns, finals, n, scale)  # [N]
        metrics = episode_metrics(trajs)
        metrics["reward/final_mean"] = sum(finals) / len(finals)
        return rollout, returns, advantages, metrics

    def evaluate(self, engine, examples: list[Example], max_batch: int = 256) -> dict[str, float]:
        """Greedy episodes on ``examples``: accuracy (final reward >= 1) and success (final
        reward > 0), each with its standard error; mean final reward, turns, tool calls, tokens."""
        params = SamplingParams(temperature=0.0, stop_token_ids=self.stop_token_ids)
        trajs = []
        for i in range(0, len(examples), max_batch):
            _, part = run_episodes(
                engine,
                self.env,
                self.encoder,
                examples[i : i + max_batch],
                1,
                params,
                self.limits,
            )
            trajs += part
        acc, se = mean_and_se([float(t.reward >= CORRECT) for t in trajs])
        won, won_se = mean_and_se([float(t.reward > 0) for t in trajs])
        out = {"problems": float(len(trajs)), "greedy_accuracy": acc, "greedy_accuracy_se": se}
        # Environments that scale a success by its turns (guess): any positive final reward.
        out.update({"success": won, "success_se": won_se})
        out["final_reward"] = sum(t.reward for t in trajs) / max(len(trajs), 1)
        out.update({k.split("/", 1)[1]: v for k, v in episode_metrics(trajs).items()})
        return out


def make_episodes(cfg: Any, env: Environment, tokenizer: Any, fmt: Any) -> Episodes | None:
    """The multi-turn driver of a run, or None for single-turn tasks (the batched path)."""
    if not env.multi_turn:
        return None
    return Episodes(cfg, env, tokenizer, fmt)
