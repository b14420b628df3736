"""``gspo eval --completions-key FIELD``: score completions the data already holds (a column
such as HumanEval's ``canonical_solution``, or a model's saved outputs) with the run's reward,
no model loaded: the check that the reward and the data agree, before any training.

The field is read from each problem's row (a data file's other columns, or a task's
``Example.meta``); ``--prompt-key``'s and ``--answer-key``'s columns name the prompt and the
reference answer themselves. Reported: the mean reward, the share of problems given full
reward (reward >= 1, "solved"), each with its standard error over problems, and the reward's
errors (a call that raised or returned no number scores 0 and is counted)."""

from __future__ import annotations

import math
from typing import Any

from gspo.config.eval_config import EvalConfig
from gspo.envs.rewards import reward_workers, score
from gspo.envs.tasks.base import Example, RewardFn


def given_completion(cfg: EvalConfig, example: Example, index: int) -> str:
    """The completion ``cfg.completions_key`` names for one problem (ValueError if none)."""
    key = cfg.completions_key
    if key == cfg.prompt_key:
        return example.prompt
    if key == cfg.answer_key and key not in example.meta:
        return example.answer
    if key not in example.meta:
        columns = sorted({cfg.prompt_key, cfg.answer_key, *example.meta})
        raise ValueError(f"--completions-key {key!r}: problem {index} has no such field "
                         f"(fields: {', '.join(columns)})")  # fmt: skip
    value = example.meta[key]
    if not isinstance(value, str):
        raise ValueError(f"--completions-key {key!r}: problem {index}'s value is a "
                         f"{type(value).__name__}, not text")  # fmt: skip
    return value


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def score_given(
    cfg: EvalConfig, examples: list[Example], reward: RewardFn
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(metrics, per-problem records) of the given completions under ``reward``."""
    texts = [given_completion(cfg, ex, i) for i, ex in enumerate(examples)]
    rewards, errors = score(reward, texts, examples, workers=reward_workers(reward))
    mean, mean_se = _mean_se(rewards)
    solved, solved_se = _mean_se([float(r >= 1.0) for r in rewards])
    metrics = {
        "problems": float(len(examples)),
        "given_reward": mean,
        "given_reward_se": mean_se,
        "given_solved": solved,
        "given_solved_se": solved_se,
        "reward_errors": float(errors),
    }
    details = [
        {"prompt": ex.prompt, "answer": ex.answer, "completion": text, "reward": r}
        for ex, text, r in zip(examples, texts, rewards, strict=True)
    ]
    return metrics, details
