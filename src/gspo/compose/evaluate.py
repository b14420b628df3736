"""``evaluate(cfg)``: the composition root of an evaluation (model, engine, problems and the
task's environment from an ``EvalConfig``), what ``gspo eval`` runs; the held-out scoring itself
(the same function inside training and after ``gspo sft``) is
:mod:`gspo.orchestration.evaluation`."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from gspo.config import SFTConfig
from gspo.config.eval_config import EvalConfig
from gspo.config.options import EngineOptions, ModelOptions
from gspo.config.options_task import TaskOptions
from gspo.core.seeding import step_generator
from gspo.envs.agent import episode_env
from gspo.envs.base import Environment, env_factory, env_for
from gspo.envs.driver import Limits
from gspo.envs.episodes import episode_limits
from gspo.envs.rewards import get_reward, uses_sandbox
from gspo.envs.tasks.base import Example, RewardFn, Task
from gspo.envs.tasks.files import load_examples
from gspo.models.policy import build_prompt_format, resolve_device, set_threads
from gspo.orchestration import evaluation
from gspo.rollout.engines import build_engine, check_engine_available, close_engine

from .given import score_given
from .parts import build_policy_for, builder_task
from .prompts import eval_prompt_rules


def eval_examples(cfg: EvalConfig) -> tuple[list[Example], RewardFn, str]:
    """(problems, reward, description) that ``gspo eval`` scores: a data file's rows
    (``cfg.data``) or a built-in task's held-out split (``cfg.task``)."""
    return _problems(cfg)[:3]


def _problems(cfg: EvalConfig) -> tuple[list[Example], RewardFn, str, Task | None]:
    """:func:`eval_examples` and the task (None for a data file)."""
    task = None
    if cfg.data:
        reward = get_reward(cfg.reward)
        examples = load_examples(
            cfg.data,
            prompt_key=cfg.prompt_key,
            answer_key=cfg.answer_key,
            answer_format=cfg.answer_format,
            split="test",
            answer_optional=uses_sandbox(reward),  # rows scored by their tests
            image_key=cfg.image_key,
        )
        where = f"file {cfg.data} (reward {cfg.reward})"
    else:
        task = builder_task(dataclasses.replace(TaskOptions.of(cfg), n_train=0), cfg.seed)
        about = task.description or task.name  # a builder's Task may have no description
        examples, reward, where = task.test, task.reward, f"task {about}, test split"
    if cfg.limit > 0:
        examples = examples[: cfg.limit]
    return list(examples), reward, where, task


def eval_env(
    cfg: EvalConfig | SFTConfig, task: Task | None, chat: bool
) -> tuple[Environment | None, Limits]:
    """The environment ``gspo eval`` and ``gspo sft``'s held-out score run, and its limits: a task's registered
    environment as training builds it (:func:`gspo.envs.base.env_for`, multi-turn included);
    None for a data file or a task without one (its reward as one turn, with reward workers,
    as the trainer's ``eval_env``)."""
    env = None
    opts = TaskOptions.of(cfg)
    if task is not None and env_factory(task, opts) is not None:  # --env or a registered one
        env = episode_env(env_for(task, opts, chat), opts.endpoint_host, opts.endpoint_port)
    multi = env is not None and env.multi_turn
    return env, episode_limits(TaskOptions.of(cfg), cfg.max_new_tokens, multi)


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """``gspo eval``: load the model, score the problems, write the JSON report, return it."""
    if cfg.completions_key is not None:  # the data's own completions: no model
        return _write(cfg, given_report(cfg))
    check_engine_available(
        EngineOptions.of(cfg)
    )  # e.g. vLLM missing: say so before loading anything
    set_threads(cfg.threads)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    examples, reward, where, task = _problems(cfg)
    if not examples:
        raise ValueError(f"nothing to evaluate: {where} has no problems")
    model, tokenizer = build_policy_for(cfg, device)
    model.eval()
    fmt = build_prompt_format(ModelOptions.of(cfg), tokenizer, model)
    env, limits = eval_env(cfg, task, fmt.chat)
    multi = env is not None and env.multi_turn  # prompt + max_total_tokens must fit
    examples, prompt_rules = eval_prompt_rules(cfg, examples, fmt, model, where, multi)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else fmt.stop_token_ids[0]
    engine = build_engine(
        EngineOptions.of(cfg),
        model,
        tokenizer,
        seed=cfg.seed,
        logprobs=False,  # evaluation reads no log-probs (its top-p may be < 1)
        pad_id=tokenizer.pad_token_id,
        eos_id=eos,
    )
    t_load = time.perf_counter() - t0
    details: list[dict[str, Any]] = []
    try:
        metrics = evaluation.evaluate(
            engine,
            tokenizer,
            examples,
            reward,
            max_new_tokens=cfg.max_new_tokens,
            samples=cfg.samples,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            generator=step_generator(cfg.seed, 0, stream=3, device=engine.device),
            batch_size=cfg.batch_size,
            greedy=cfg.greedy,
            prompt_format=fmt,
            details=details,
            progress=cfg.progress,
            env=env,
            limits=limits,
        )
    finally:
        close_engine(engine)  # vLLM: shut it down (the torch engine has nothing to close)
    report = {
        "model": cfg.model,
        "data": where,
        "chat_template": fmt.chat,
        "stop_token_ids": list(fmt.stop_token_ids),
        "metrics": metrics,
        "prompts": prompt_rules,
        "seconds": {"load": t_load, "total": time.perf_counter() - t0},
        "config": dataclasses.asdict(cfg),
        "examples": details[: cfg.show] if cfg.show > 0 else details,
    }
    return _write(cfg, report)


def given_report(cfg: EvalConfig) -> dict[str, Any]:
    """The report of ``--completions-key``: the problems' given completions under the reward."""
    t0 = time.perf_counter()
    examples, reward, where, _ = _problems(cfg)
    if not examples:
        raise ValueError(f"nothing to evaluate: {where} has no problems")
    metrics, details = score_given(cfg, examples, reward)
    return {
        "model": None,
        "completions_key": cfg.completions_key,
        "data": where,
        "metrics": metrics,
        "seconds": {"total": time.perf_counter() - t0},
        "config": dataclasses.asdict(cfg),
        "examples": details[: cfg.show] if cfg.show > 0 else details,
    }


def _write(cfg: EvalConfig, report: dict[str, Any]) -> dict[str, Any]:
    if cfg.output:
        path = Path(cfg.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
    return report
