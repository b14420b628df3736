"""Held-out evaluation: greedy accuracy, avg@k and pass@k with standard errors.

The same function runs inside training (every ``eval_every`` steps) and from ``gspo eval``.
A sample counts as *correct* when its reward is at least ``CORRECT`` (rewards of the built-in
tasks are 0 or 1); avg@k is the mean reward over k samples per problem.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .build import decode_completions, encode_prompts
from .rewards import score
from .rollout.base import SamplingParams
from .tasks.base import Example, RewardFn

CORRECT = 1.0 - 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c,k)/C(n,k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(n)); se is 0 for fewer than 2 values."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def summarize(rewards: list[list[float]], k: int) -> dict[str, float]:
    """avg@k and pass@k (with standard errors over problems) from per-problem sample rewards."""
    per_avg = [sum(r) / len(r) for r in rewards]
    per_pass = [pass_at_k(len(r), sum(x >= CORRECT for x in r), k) for r in rewards]
    avg, avg_se = mean_and_se(per_avg)
    pas, pas_se = mean_and_se(per_pass)
    return {f"avg@{k}": avg, f"avg@{k}_se": avg_se, f"pass@{k}": pas, f"pass@{k}_se": pas_se}


def _generate_scored(engine, tokenizer, examples, reward_fn, params, n, generator, batch_size):
    """Rewards [problem][sample], completion lengths and truncation flags, in prompt batches."""
    rewards: list[list[float]] = []
    lengths: list[int] = []
    truncated: list[bool] = []
    errors = 0
    per_batch = max(batch_size // n, 1)
    for start in range(0, len(examples), per_batch):
        chunk = list(examples[start : start + per_batch])
        rollout = engine.generate(
            encode_prompts(tokenizer, [e.prompt for e in chunk]), n, params, generator
        )
        texts = decode_completions(tokenizer, rollout.completion_ids, rollout.completion_mask)
        repeated = [e for e in chunk for _ in range(n)]
        r, err = score(reward_fn, texts, repeated)
        errors += err
        rewards += [r[i * n : (i + 1) * n] for i in range(len(chunk))]
        lengths += rollout.completion_lengths().tolist()
        truncated += [f == "length" for f in rollout.finish_reasons]
    return rewards, lengths, truncated, errors


def evaluate(
    engine,
    tokenizer,
    examples: Sequence[Example],
    reward_fn: RewardFn,
    *,
    max_new_tokens: int,
    samples: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
    greedy: bool = True,
) -> dict[str, float]:
    """Metrics on ``examples``: greedy accuracy (one greedy completion each) and avg@k / pass@k
    of ``samples`` sampled completions each, mean response length and truncated share."""
    if not examples:
        return {}
    out: dict[str, float] = {"problems": float(len(examples))}
    if greedy:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        r, lengths, trunc, err = _generate_scored(
            engine, tokenizer, examples, reward_fn, params, 1, None, batch_size
        )
        acc, se = mean_and_se([float(x[0] >= CORRECT) for x in r])
        out.update(
            {
                "greedy_accuracy": acc,
                "greedy_accuracy_se": se,
                "greedy_response_length": sum(lengths) / len(lengths),
                "greedy_truncated_fraction": sum(trunc) / len(trunc),
            }
        )
    if samples > 0:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        r, lengths, trunc, err2 = _generate_scored(
            engine, tokenizer, examples, reward_fn, params, samples, generator, batch_size
        )
        out.update(summarize(r, samples))
        if samples > 1:
            out.update({k: v for k, v in summarize(r, 1).items() if k.startswith("pass@1")})
        out["response_length"] = sum(lengths) / len(lengths)
        out["truncated_fraction"] = sum(trunc) / len(trunc)
        out["reward_errors"] = float(err2)
    return out
