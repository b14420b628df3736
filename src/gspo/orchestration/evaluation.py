"""Held-out evaluation: greedy accuracy, avg@k and pass@k with standard errors.

The same function runs inside training (every ``eval_every`` steps) and from ``gspo eval``
(:mod:`gspo.compose.evaluate`).
A sample counts as *correct* when its reward is at least ``CORRECT`` (rewards of the built-in
tasks are 0 or 1); avg@k is the mean reward over k samples per problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gspo.config.evaluation import EvalConfig
from gspo.core.metrics import CORRECT, mean_and_se, pass_at_k
from gspo.envs.base import Environment, SingleTurnEnv
from gspo.envs.driver import Limits
from gspo.envs.one_turn import run_one_turn
from gspo.envs.rewards import reward_workers
from gspo.envs.tasks.base import Example, RewardFn
from gspo.envs.trajectory import PlainEncoder
from gspo.models.chat import PromptFormat
from gspo.models.chat import prompt_format as prompt_format_for
from gspo.rollout.base import SamplingParams

ENV_TIMEOUT_S = 10.0
"""Seconds one ``step`` of an environment without ``step_batch`` may take in an evaluation."""


def summarize(rewards: list[list[float]], k: int) -> dict[str, float]:
    """avg@k and pass@k (with standard errors over problems) from per-problem sample rewards."""
    per_avg = [sum(r) / len(r) for r in rewards]
    per_pass = [pass_at_k(len(r), sum(x >= CORRECT for x in r), k) for r in rewards]
    avg, avg_se = mean_and_se(per_avg)
    pas, pas_se = mean_and_se(per_pass)
    return {f"avg@{k}": avg, f"avg@{k}_se": avg_se, f"pass@{k}": pas, f"pass@{k}_se": pas_se}


def _generate_scored(engine, fmt, examples, env, params, n, generator, batch_size, bar):
    """Per problem: sample rewards and texts; per sample: lengths and truncation flags; and
    the number of failed episodes (rewards that raised). One-turn episodes of ``env`` through
    the driver's round; prompts go to the engine ``batch_size // n`` at a time."""
    rewards: list[list[float]] = []
    texts_out: list[list[str]] = []
    lengths: list[int] = []
    truncated: list[bool] = []
    errors = 0
    per_batch = max(batch_size // n, 1)
    encoder = PlainEncoder(fmt.tokenizer)  # the prompts come encoded: its tokenizer decodes
    limits = Limits(1, params.max_new_tokens, params.max_new_tokens, env_timeout_s=ENV_TIMEOUT_S)
    for start in range(0, len(examples), per_batch):
        chunk = list(examples[start : start + per_batch])
        prompts = fmt.encode([e.prompt for e in chunk])
        rollout, trajs = run_one_turn(
            engine, env, encoder, chunk, n, params, limits, generator, prompts, routing=False
        )
        r = [t.reward for t in trajs]
        texts = [t.history[-1]["content"] for t in trajs]
        errors += sum(t.finish == "failed" for t in trajs)
        rewards += [r[i * n : (i + 1) * n] for i in range(len(chunk))]
        texts_out += [texts[i * n : (i + 1) * n] for i in range(len(chunk))]
        lengths += rollout.completion_lengths().tolist()
        truncated += [f == "length" for f in rollout.finish_reasons]
        if bar is not None:
            bar.update(len(chunk) * n)
    return rewards, texts_out, lengths, truncated, errors


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
    prompt_format: PromptFormat | None = None,
    details: list[dict[str, Any]] | None = None,
    progress: bool = False,
    env: Environment | None = None,
) -> dict[str, float]:
    """Metrics on ``examples``: greedy accuracy (one greedy completion each) and avg@k / pass@k
    of ``samples`` sampled completions each (k = ``samples``; pass@1 too when k > 1), each with
    its standard error over problems, mean response length and truncated share.

    ``prompt_format`` turns prompts into ids and gives the stop tokens (chat models); None
    means raw prompts ending on EOS. With a ``details`` list, one record per problem (prompt,
    answer, completions, rewards) is appended to it. ``env``: a one-turn environment that
    scores the completions instead of ``reward_fn`` (the trainer's evaluation of its task's
    environment); every completion is a one-turn episode through the driver
    (:mod:`gspo.envs.one_turn`).
    """
    if not examples:
        return {}
    fmt = prompt_format if prompt_format is not None else prompt_format_for(tokenizer, mode="none")
    if env is None:
        env = SingleTurnEnv(reward_fn, workers=reward_workers(reward_fn))
    stops = tuple(fmt.stop_token_ids)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        total = len(examples) * (int(greedy) + samples)
        bar = tqdm(total=total, desc="eval", unit="completion", dynamic_ncols=True)
    out: dict[str, float] = {"problems": float(len(examples))}
    errors = 0
    greedy_texts: list[list[str]] = []
    greedy_rewards: list[list[float]] = []
    if greedy:
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stops
        )
        greedy_rewards, greedy_texts, lengths, trunc, err = _generate_scored(
            engine, fmt, examples, env, params, 1, None, batch_size, bar
        )
        errors += err
        acc, se = mean_and_se([float(x[0] >= CORRECT) for x in greedy_rewards])
        out.update(
            {
                "greedy_accuracy": acc,
                "greedy_accuracy_se": se,
                "greedy_response_length": sum(lengths) / len(lengths),
                "greedy_truncated_fraction": sum(trunc) / len(trunc),
            }
        )
    sampled_texts: list[list[str]] = []
    sampled_rewards: list[list[float]] = []
    if samples > 0:
        params = SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop_token_ids=stops,
        )
        sampled_rewards, sampled_texts, lengths, trunc, err = _generate_scored(
            engine, fmt, examples, env, params, samples, generator, batch_size, bar
        )
        errors += err
        out.update(summarize(sampled_rewards, samples))
        if samples > 1:
            out.update(
                {k: v for k, v in summarize(sampled_rewards, 1).items() if k.startswith("pass@1")}
            )
        out["response_length"] = sum(lengths) / len(lengths)
        out["truncated_fraction"] = sum(trunc) / len(trunc)
    out["reward_errors"] = float(errors)
    if bar is not None:
        bar.close()
    if details is not None:
        for i, example in enumerate(examples):
            record: dict[str, Any] = {"prompt": example.prompt, "answer": example.answer}
            if greedy:
                record["greedy"] = greedy_texts[i][0]
                record["greedy_reward"] = greedy_rewards[i][0]
            if samples > 0:
                record["samples"] = sampled_texts[i]
                record["rewards"] = sampled_rewards[i]
            details.append(record)
    return out


def eval_examples(cfg: EvalConfig) -> tuple[list[Example], RewardFn, str]:
    """(problems, reward, description) that ``gspo eval`` scores: a data file's rows
    (``cfg.data``) or a built-in task's held-out split (``cfg.task``)."""
    if cfg.data:
        from gspo.envs.rewards import get_reward, uses_sandbox
        from gspo.envs.tasks.files import load_examples

        reward = get_reward(cfg.reward)
        examples = load_examples(
            cfg.data,
            prompt_key=cfg.prompt_key,
            answer_key=cfg.answer_key,
            answer_format=cfg.answer_format,
            split="test",
            answer_optional=uses_sandbox(reward),  # rows scored by their tests
        )
        where = f"file {cfg.data} (reward {cfg.reward})"
    else:
        from gspo.envs.tasks import make_task

        task = make_task(
            cfg.task, n_train=0, n_test=cfg.n_test, seed=cfg.seed, difficulty=cfg.difficulty
        )
        examples, reward, where = task.test, task.reward, f"task {task.description}, test split"
    if cfg.limit > 0:
        examples = examples[: cfg.limit]
    return list(examples), reward, where


def evaluate_model(
    model,
    tokenizer,
    examples: Sequence[Example],
    reward_fn: RewardFn,
    *,
    max_new_tokens: int,
    prompt_format: PromptFormat | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """:func:`evaluate` of a model in hand: the held-out score after SFT, of a starting
    checkpoint, or of ``gspo eval``'s model (one rollout engine over ``model``, no copy).
    ``kwargs`` are :func:`evaluate`'s (samples, temperature, generator, greedy, ...)."""
    from gspo.rollout.torch_engine import TorchEngine

    eos = tokenizer.eos_token_id
    if eos is None and prompt_format is not None and prompt_format.stop_token_ids:
        eos = prompt_format.stop_token_ids[0]
    engine = TorchEngine(model, pad_id=tokenizer.pad_token_id, eos_id=eos)
    return evaluate(
        engine,
        tokenizer,
        examples,
        reward_fn,
        max_new_tokens=max_new_tokens,
        prompt_format=prompt_format,
        **kwargs,
    )
