"""``train(cfg)``: the composition root of an RL run.

It turns a config into built parts (policy backend, rollout engine, task and rewards, prompts,
logger) and hands them to the loop (:func:`gspo.orchestration.loop.run`), which never builds
anything itself. Resuming restores the backend's checkpoint and the loop's
:class:`~gspo.orchestration.steps.StepState`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ..backend.checkpoint import clean_stale, discard_run
from ..backend.local import LocalBackend
from ..config import ConfigError, TrainConfig, to_dict
from ..config.combinations import early_problems
from ..config.names import declared
from ..config.scale import BACKENDS as SCALE_BACKENDS
from ..envs import env_for
from ..envs.base import env_factory
from ..envs.episodes import make_episodes
from ..envs.rewards import reward_workers, uses_sandbox
from ..models import moe
from ..models.policy import build_policy, build_prompt_format, resolve_device, set_threads
from ..orchestration.logging import MetricsLogger, read_metrics
from ..orchestration.loop import NonFiniteTrainingError, RunResult, build_source, run
from ..orchestration.ray_parts import build_ray_parts, ray_scorer
from ..orchestration.ray_rewards import use_ray_tasks
from ..orchestration.steps import Parts, StepState
from ..rollout.base import SamplingParams
from ..rollout.engines import check_engine_available, close_engine, policy_engine
from ..sandbox import isolation
from .parts import build_task, build_train_reward, refuse_mrope_paths
from .prompts import prepare_prompts
from .ray_check import check_backend_available
from .resume import check_changes, saved_config

__all__ = ["NonFiniteTrainingError", "RunResult", "ensure_writable", "train"]


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
    """Run (or resume) the RL run described by ``cfg``. A new run (not ``resume``) first
    removes an earlier run's checkpoints and final model from ``output_dir``, so that two runs
    never mix there (``gspo train`` refuses such a folder unless ``--overwrite`` moved it
    aside). ``stop_after``: the global step to stop at, with a checkpoint."""
    early = early_problems(cfg)  # what construction refused before (a config made in Python)
    if early:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(early))
    check_engine_available(cfg.engine)  # e.g. vLLM missing: say so before any work
    check_backend_available(cfg.backend)  # backend='ray': Ray installed, ray_address reachable
    set_threads(cfg.run.threads)
    out = Path(cfg.run.output_dir)
    found = None
    last = cfg.run.steps if cfg.run.stop_after is None else min(cfg.run.steps, cfg.run.stop_after)
    if resume:  # before any work: the checkpoint must belong to this run (gspo.compose.resume)
        saved, step, found = saved_config(out)
        check_changes(saved, to_dict(cfg), str(found))
        if cfg.run.stop_after is not None and cfg.run.stop_after <= step:
            raise ConfigError(
                f"stop_after={cfg.run.stop_after} is not past the checkpoint's step {step} in "
                f"{out}: stop_after is the global step to stop at (pass --stop-after N > {step}, "
                "or leave it out)"
            )
    created = not out.exists()
    ensure_writable(out)
    clean_stale(out)  # temporary folders of a write a kill interrupted
    if not resume:  # a new run never shares the folder with an earlier run's checkpoints
        discard_run(out)
    try:
        parts = build_parts(cfg, out)
    except BaseException:
        # A run refused while it was being built (bad data, a model that does not load) leaves
        # the folder as it found it: nothing there may mark it as holding a run, or the retry
        # with the fix would be refused ("already holds a run").
        if created and not resume:
            shutil.rmtree(out, ignore_errors=True)
        raise
    # The run's config at its root, so `gspo report` can group runs by algo and seed: written
    # once the run passed its checks (it marks the folder as holding a run).
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    state = StepState(seed=cfg.run.seed)
    try:
        if found is not None:
            state = StepState.from_checkpoint(parts.backend.load_checkpoint(found), cfg.run.seed)
            parts.backend.push_weights(parts.engine)
        logger = MetricsLogger(
            out,
            resume_step=state.step,
            tensorboard=cfg.run.tensorboard,
            wandb=cfg.run.wandb,
            config=to_dict(cfg),
        )
        # A resumed run's records up to its checkpoint (the logger dropped later ones): with
        # them the result, its plots and tables cover the whole run from step 0.
        earlier = read_metrics(logger.path) if state.step > 0 else []
        try:
            parts.source.start(state.step, last)  # async: the thread makes state.step .. last-1
            return run(parts, state, logger, last, earlier)
        finally:
            parts.source.close()
            logger.close()
    finally:
        close_engine(parts.engine)  # vLLM: shut its engine down (torch: nothing to close)
        parts.backend.close()


def _local_parts(cfg: TrainConfig, model, tokenizer, device, out, workers, rewards):
    """One process: the local backend, and the torch engine (sharing the model unless
    ``engine_dtype``) or vLLM (its own copy, synced every step); rewards scored in-process."""
    engine = policy_engine(cfg, model, tokenizer)
    if engine.model is not None:  # an engine copy in float64 needs the eager experts
        moe.fit_experts_kernel(engine.model)
    return LocalBackend(cfg, model, device), engine, None


def _ray_parts(cfg: TrainConfig, model, tokenizer, device, out, workers, rewards):
    """FSDP2 ranks (+ rollout workers) as Ray actors; rewards in Ray tasks where they pay."""
    tasks = workers if use_ray_tasks(cfg, rewards[0]) else 0
    backend, engine = build_ray_parts(cfg, model, tokenizer, out, reward_cpus=tasks)
    return backend, engine, ray_scorer(backend, engine, tasks, rewards)


BACKENDS = declared(SCALE_BACKENDS, {"local": _local_parts, "ray": _ray_parts}, "backends")
"""Training backends by ``backend`` name: ``build(cfg, model, tokenizer, device, out,
reward_workers, (train_reward, task_reward)) -> (backend, engine, scorer or None)`` (a scorer
scores the episodes' rewards elsewhere than in this process), the names
``gspo.config.scale.BACKENDS`` declares (torch-free, for config checks)."""


def build_parts(cfg: TrainConfig, out: Path) -> Parts:
    """The run's parts: policy and its backend, rollout engine, task, rewards, prompts. Below
    here every layer reads only the parts of the config it needs (``cfg.model``, ...)."""
    device = resolve_device(cfg.run.device)
    model, tokenizer = build_policy(cfg.model, device, seed=cfg.run.seed)
    if cfg.model.model != "tiny-qwen-vl":
        refuse_mrope_paths(cfg, model)  # a Qwen2.5-VL checkpoint: known once loaded
    task = build_task(cfg)
    if not task.train:
        raise ValueError(f"task {task.name} has no training problems")
    # Chat template (pretrained chat models) or raw prompts (tiny char models), its stop tokens.
    fmt = build_prompt_format(cfg.model, tokenizer, model)
    train_reward = build_train_reward(cfg.reward, task)
    workers = reward_workers(train_reward, cfg.reward.reward_workers)
    # Every task runs episodes of its environment through gspo.envs (single-turn: one turn);
    # without a registered one, the task's reward is its environment (+ the format bonus).
    env = env_for(task, cfg.task, fmt.chat)
    own = None if env_factory(task, cfg.task) is not None else train_reward
    episodes = make_episodes(cfg, env, tokenizer, fmt, train_reward=own, workers=workers)
    if uses_sandbox(train_reward):  # the startup line: which sandbox guarantees hold here
        print(isolation().summary(), file=sys.stderr, flush=True)
    train_set, prompt_cache, test_set, data_metrics = prepare_prompts(
        cfg, task, fmt, tokenizer, model, episodes.eval_env.multi_turn
    )
    build_backend = BACKENDS[cfg.backend.backend]
    backend, engine, scorer = build_backend(
        cfg, model, tokenizer, device, out, workers, (train_reward, task.reward)
    )
    if scorer is not None:
        episodes.use_scorer(scorer.each)
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        stop_token_ids=fmt.stop_token_ids,
    )
    parts = Parts(
        cfg=cfg,
        backend=backend,
        engine=engine,
        tokenizer=tokenizer,
        fmt=fmt,
        task=task,
        train_reward=train_reward,
        train_set=train_set,
        prompt_cache=prompt_cache,
        test_set=test_set,
        params=params,
        episodes=episodes,
        reward_workers=workers,
        device=device,
        output_dir=out,
        data_metrics=data_metrics,
        scorer=scorer,
    )
    parts.source = build_source(parts, model)  # synchronous unless max_staleness >= 1
    return parts
