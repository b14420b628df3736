"""Held-out evaluation: greedy accuracy, avg@k and pass@k with standard errors.

One function, :func:`evaluate`, scores a task's environment wherever a model is evaluated:
inside training (every ``eval_every`` steps), ``gspo eval`` (:mod:`gspo.compose.evaluate`) and
the held-out score after ``gspo sft`` (:func:`evaluate_model`). Each passes the task's
environment (:func:`gspo.envs.base.env_for`: a registered multi-turn environment, or the task's
reward as a one-turn :class:`SingleTurnEnv`) and the episode limits.

One-turn episodes: a sample counts as *correct* when its reward is at least ``CORRECT``
(rewards of the built-in tasks are 0 or 1); avg@k is the mean reward over k samples per problem.
Multi-turn episodes (:func:`_evaluate_episodes`): whole episodes, greedy and ``samples`` sampled
ones per problem; a sample is *solved* when its environment reported success
(:attr:`gspo.envs.base.Step.success`); pass@k counts solved samples, avg@k is the mean final
reward, ``sampled_success`` the share of solved samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from gspo.core.metrics import CORRECT, mean_and_se, pass_at_k
from gspo.envs.base import Environment, SingleTurnEnv
from gspo.envs.driver import Limits, episode_metrics, run_episodes, run_one_turn
from gspo.envs.episode_request import EpisodeRequest
from gspo.envs.rewards import reward_workers
from gspo.envs.tasks.base import Example, RewardFn
from gspo.envs.trajectory import PlainEncoder, Trajectory, make_encoder
from gspo.models.chat import PromptFormat, encode_examples
from gspo.models.chat import prompt_format as prompt_format_for
from gspo.rollout.base import SamplingParams
from gspo.rollout.torch_engine import TorchEngine

ENV_TIMEOUT_S = 10.0
"""Seconds one ``step`` of an environment without ``step_batch`` may take in an evaluation."""


def summarize(
    rewards: list[list[float]], k: int, solved: list[list[bool]] | None = None
) -> dict[str, float]:
    """avg@k and pass@k (with standard errors over problems) from per-problem sample rewards;
    a sample passes when its reward is at least ``CORRECT``, or, given ``solved`` (per problem,
    per sample), when it is solved."""
    per_avg = [sum(r) / len(r) for r in rewards]
    if solved is None:
        solved = [[x >= CORRECT for x in r] for r in rewards]
    per_pass = [pass_at_k(len(s), sum(s), k) for s in solved]
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
    encoder.fmt = fmt  # image prompts: their pixel inputs come from the format's processor
    limits = Limits(1, params.max_new_tokens, params.max_new_tokens, env_timeout_s=ENV_TIMEOUT_S)
    for start in range(0, len(examples), per_batch):
        chunk = list(examples[start : start + per_batch])
        prompts, _ = encode_examples(fmt, chunk)
        request = EpisodeRequest(engine, env, encoder, chunk, n, params, limits, generator, prompts)
        rollout, trajs = run_one_turn(request, routing=False)
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
    limits: Limits | None = None,
) -> dict[str, float]:
    """Metrics on ``examples``: greedy accuracy (one greedy completion each) and avg@k / pass@k
    of ``samples`` sampled completions each (k = ``samples``; pass@1 too when k > 1), each with
    its standard error over problems, mean response length and truncated share.

    ``prompt_format`` turns prompts into ids and gives the stop tokens (chat models); None
    means raw prompts ending on EOS. With a ``details`` list, one record per problem (prompt,
    answer, completions, rewards) is appended to it. ``env``: the task's environment, which
    scores instead of ``reward_fn`` (None: ``reward_fn`` as a one-turn environment); a one-turn
    environment's completions are one-turn episodes through the driver
    (:mod:`gspo.envs.driver`), a multi-turn environment's whole episodes within ``limits``
    (:func:`_evaluate_episodes`; default: :class:`Limits` with ``max_new_tokens`` per turn).
    """
    if not examples:
        return {}
    fmt = prompt_format if prompt_format is not None else prompt_format_for(tokenizer, mode="none")
    if env is None:
        env = SingleTurnEnv(reward_fn, workers=reward_workers(reward_fn))
    stops = tuple(fmt.stop_token_ids)
    bar = None
    if progress:
        total = len(examples) * (int(greedy) + samples)
        unit = "episode" if env.multi_turn else "completion"
        bar = tqdm(total=total, desc="eval", unit=unit, dynamic_ncols=True)
    if env.multi_turn:
        if limits is None:
            limits = Limits(max_tokens_per_turn=max_new_tokens, env_timeout_s=ENV_TIMEOUT_S)
        sampled = SamplingParams(temperature=temperature, top_p=top_p, stop_token_ids=stops)
        try:
            return _evaluate_episodes(
                engine, fmt, list(examples), env, limits, samples, sampled, generator,
                batch_size, greedy, details, bar,
            )  # fmt: skip
        finally:
            if bar is not None:
                bar.close()
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
    ``kwargs`` are :func:`evaluate`'s (samples, temperature, generator, greedy, env, limits,
    ...)."""
    eos = tokenizer.eos_token_id
    if eos is None and prompt_format is not None and prompt_format.stop_token_ids:
        eos = prompt_format.stop_token_ids[0]
    engine = TorchEngine(model, pad_id=tokenizer.pad_token_id, eos_id=eos, tokenizer=tokenizer)
    return evaluate(
        engine,
        tokenizer,
        examples,
        reward_fn,
        max_new_tokens=max_new_tokens,
        prompt_format=prompt_format,
        **kwargs,
    )


def _episodes(engine, encoder, examples, env, limits, n, params, generator, batch_size, bar):
    """``n`` whole episodes of each example (grouped: episode j of problem i at i*n + j),
    ``batch_size // n`` problems per driver call."""
    trajs: list[Trajectory] = []
    per_batch = max(batch_size // n, 1)
    for start in range(0, len(examples), per_batch):
        chunk = examples[start : start + per_batch]
        _, part = run_episodes(engine, env, encoder, chunk, n, params, limits, generator)
        trajs += part
        if bar is not None:
            bar.update(len(part))
    return trajs


def _evaluate_episodes(
    engine, fmt, examples, env, limits, samples, sampled, generator, batch_size, greedy, details,
    bar,
) -> dict[str, float]:  # fmt: skip
    """Multi-turn evaluation. Greedy (one episode each): ``greedy_accuracy`` (final reward >=
    CORRECT), ``success`` (the environment reported success), each with its standard error,
    ``final_reward`` and the episode/* means; with ``samples`` k > 0, k sampled episodes each
    (``sampled``: their sampling parameters): ``sampled_success``, avg@k (final reward) and
    pass@k (solved samples), pass@1 too when k > 1, with standard errors over problems."""
    encoder = make_encoder(fmt.tokenizer, fmt)
    out: dict[str, float] = {"problems": float(len(examples))}
    records: list[dict[str, Any]] = [{"prompt": e.prompt, "answer": e.answer} for e in examples]
    if greedy:
        params = SamplingParams(temperature=0.0, stop_token_ids=sampled.stop_token_ids)
        trajs = _episodes(engine, encoder, examples, env, limits, 1, params, None, batch_size, bar)
        acc, se = mean_and_se([float(t.reward >= CORRECT) for t in trajs])
        won, won_se = mean_and_se([float(t.success is True) for t in trajs])
        out.update({"greedy_accuracy": acc, "greedy_accuracy_se": se})
        out.update({"success": won, "success_se": won_se})
        out["final_reward"] = sum(t.reward for t in trajs) / len(trajs)
        # episode/turns_mean -> turns_mean; an environment's own (a rubric's vf/correct) keep
        # their namespace: eval/vf/correct, as training logs vf/correct
        out.update({k.removeprefix("episode/"): v for k, v in episode_metrics(trajs).items()})
        for record, t in zip(records, trajs, strict=True):
            record.update(greedy=t.history, greedy_reward=t.reward, greedy_success=t.success)
    if samples > 0:
        trajs = _episodes(
            engine, encoder, examples, env, limits, samples, sampled, generator, batch_size, bar
        )
        groups = [trajs[i * samples : (i + 1) * samples] for i in range(len(examples))]
        rewards = [[t.reward for t in g] for g in groups]
        solved = [[t.success is True for t in g] for g in groups]
        rate, rate_se = mean_and_se([sum(s) / len(s) for s in solved])
        out.update({"sampled_success": rate, "sampled_success_se": rate_se})
        out.update(summarize(rewards, samples, solved))
        if samples > 1:
            pass1 = summarize(rewards, 1, solved)
            out.update({k: v for k, v in pass1.items() if k.startswith("pass@1")})
        for record, g in zip(records, groups, strict=True):
            record.update(
                samples=[t.history for t in g],
                rewards=[t.reward for t in g],
                successes=[t.success for t in g],
            )
    if details is not None:
        details += records
    return out
