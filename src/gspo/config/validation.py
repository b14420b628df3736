"""Config validation: every problem of a config, listed in one ``ConfigError`` before any work.

An RL run's config is composed of its components' options (:mod:`gspo.config.options`: each
lists its own problems; :mod:`gspo.config.combinations`: every refused combination); what is
checked here against the task, reward and answer-format registries (torch-free themselves,
imported inside the functions) is added to them. So a
config mistake is reported in well under a second, and the plain-data modules (``fields``,
``train``, ``evaluation``, ``presets``) import nothing else.
"""

from __future__ import annotations

from typing import Any

from .combinations import problems as option_problems
from .eval_config import EvalConfig
from .fields import DTYPES, ConfigError, to_dict
from .names import (
    ANSWER_FORMATS,
    CHAT_MODES,
    format_bonus_refusal,
    integration_of,
    integration_problem,
    is_environment_task,
    one_of,
    rewards,
    tasks,
)
from .options import EngineOptions, ModelOptions, bad_device, device_ok
from .options_task import TaskOptions
from .plugins import is_ref, load_plugins, ref_problem
from .train import SFTConfig, TrainConfig

Config = TrainConfig | SFTConfig | EvalConfig


def config_error(problems: list[str], header: str = "invalid config") -> ConfigError:
    """One problem on one line; several listed together, one per line."""
    if len(problems) == 1:
        return ConfigError(f"{header}: {problems[0]}")
    return ConfigError(f"{header}:\n  - " + "\n  - ".join(problems))


def validate(cfg: Config) -> None:
    """Raise ConfigError listing every problem in ``cfg``."""
    problems = config_problems(cfg)
    if problems:
        raise config_error(problems)


def config_problems(cfg: Config) -> list[str]:
    """Every problem in ``cfg`` (empty: fine)."""
    if isinstance(cfg, TrainConfig):
        return train_problems(cfg)
    problems: list[str] = []

    def need(cond: bool, message: str) -> None:
        if not cond:
            problems.append(message)

    task = TaskOptions.of(cfg)
    _validate_model_fields(cfg.chat_template, cfg.answer_format, need)
    validate_engine(EngineOptions.of(cfg), need)  # rollout_engine, vllm_* fields
    _validate_task(task, cfg.reward, need, files=not isinstance(cfg, EvalConfig))
    _validate_episode_limits(cfg, need)
    if isinstance(cfg, EvalConfig):
        _validate_eval(cfg, need)
        return problems
    # SFT: the model's own checks are the options' (lora, MoE, shape); the rest are SFT's.
    problems += ModelOptions.of(cfg).problems()
    for name, value in _named(cfg, "n_train", "steps", "max_new_tokens", "batch_size"):
        need(value > 0, f"{name} must be positive, got {value}")
    need(cfg.n_test >= 0, f"n_test must be >= 0, got {cfg.n_test}")  # 0 skips its final eval
    need(cfg.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {cfg.checkpoint_every}")
    need(cfg.lr > 0, f"lr must be positive, got {cfg.lr}")
    need(cfg.warmup_steps >= 0, f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    need(device_ok(cfg.device), bad_device(cfg.device))
    need(cfg.threads >= 0, f"threads must be >= 0, got {cfg.threads}")
    rules = ("error", "truncate", "skip")  # training's long_prompts (TaskOptions)
    need(cfg.long_prompts in rules, one_of("long_prompts", cfg.long_prompts, rules))
    _validate_file_task(task, cfg.reward, need)
    return problems


def train_problems(cfg: TrainConfig) -> list[str]:
    """Every problem of an RL run's config: names checked against the registries, then each
    component's own problems and every refused combination (gspo.config.combinations)."""
    problems: list[str] = []

    def need(cond: bool, message: str) -> None:
        if not cond:
            problems.append(message)

    task, reward = cfg.task, cfg.reward.reward
    _validate_model_fields(cfg.model.chat_template, task.answer_format, need)
    _validate_task(task, reward, need)
    _validate_file_task(task, reward, need)
    weight = cfg.reward.format_reward_weight
    if weight:  # a task with its own environment: the env gives the rewards
        need(
            not is_environment_task(task.task) and task.env is None,
            format_bonus_refusal(task.task, weight),
        )
    problems += [p for p in option_problems(cfg) if p not in problems]
    return problems


def _validate_file_task(task: TaskOptions, reward: str | None, need: Any) -> None:
    if task.task == "file":
        need(task.train_file is not None, "task='file' needs train_file")
        # An environment named by --env pays its episodes' rewards itself: no reward needed.
        need(
            reward is not None or task.env is not None,
            f"task='file' needs reward, one of {', '.join(rewards())} (or env, an environment "
            "module:factory that pays its own rewards)",
        )


def _validate_task(task: TaskOptions, reward: str | None, need: Any, *, files: bool = True) -> None:
    """The plugins (imported here: the names they register must exist next), then the task,
    reward and environment: names against their registries (torch-free modules), or user code
    named ``module:attribute``, checked without importing it (gspo.config.plugins). ``files``:
    task 'file' is a name (not for ``gspo eval``, which reads --data instead)."""
    plugin_problems = load_plugins(task.plugins)
    for problem in plugin_problems:
        need(False, problem)
    names = (*tasks(), *(("file",) if files else ()))
    _validate_name(need, "task", task.task, names, bool(plugin_problems))
    if reward is not None:
        _validate_name(need, "reward", reward, rewards(), bool(plugin_problems))
    env = task.env
    if env is not None:
        if is_ref(env):
            problem = ref_problem("env", env)
            need(problem is None, problem or "")
        else:
            need(False, f"env must be module:factory (e.g. mymodule:make_env), got {env!r}")


def _validate_name(need: Any, field: str, value: str, names: tuple, plugins_failed: bool) -> None:
    if field == "task" and integration_of(value) is not None:  # not a module:builder reference
        problem = integration_problem(value)
        need(problem is None, problem or "")
    elif is_ref(value):
        problem = ref_problem(field, value)
        need(problem is None, problem or "")
    elif not plugins_failed:  # else the name may be one the failed plugin registers
        need(value in names, one_of(field, value, names, noun=field))


def _validate_model_fields(chat_template: str, answer_format: str, need: Any) -> None:
    """Prompt formatting and answer format (the train and SFT configs' other model fields:
    ``ModelOptions.problems``)."""
    need(chat_template in CHAT_MODES, one_of("chat_template", chat_template, CHAT_MODES))
    need(
        answer_format in ANSWER_FORMATS,
        one_of("answer_format", answer_format, ANSWER_FORMATS),
    )


def _validate_episode_limits(cfg: SFTConfig | EvalConfig, need: Any) -> None:
    """The multi-turn limits of ``gspo eval`` and ``gspo sft`` (their ``EpisodeLimits`` base,
    whose checks ``TaskOptions`` shares)."""
    for problem in cfg.episode_problems():
        need(False, problem)


def _named(cfg: SFTConfig | EvalConfig, *names: str) -> list[tuple[str, Any]]:
    """(name, value) of the flat config's fields ``names``, for checks alike over several."""
    values = to_dict(cfg)
    return [(name, values[name]) for name in names]


def _validate_eval(cfg: EvalConfig, need: Any) -> None:
    for name, value in _named(cfg, "n_test", "max_new_tokens", "batch_size"):
        need(value > 0, f"{name} must be positive, got {value}")
    for name, value in _named(cfg, "samples", "limit", "show", "threads"):
        need(value >= 0, f"{name} must be >= 0, got {value}")
    need(cfg.samples > 0 or cfg.greedy, "nothing to score: samples is 0 and greedy is off")
    key = cfg.completions_key
    need(key is None or bool(key.strip()), "completions_key must name a field, got ''")
    need(cfg.dtype in DTYPES, one_of("dtype", cfg.dtype, DTYPES))
    need(device_ok(cfg.device), bad_device(cfg.device))
    need(cfg.temperature >= 0, f"temperature must be >= 0, got {cfg.temperature}")
    need(0 < cfg.top_p <= 1, f"top_p must be in (0, 1], got {cfg.top_p}")
    need(cfg.max_prompt_tokens >= 0, f"max_prompt_tokens must be >= 0, got {cfg.max_prompt_tokens}")
    rules = ("error", "truncate", "skip")  # training's long_prompts (TaskOptions)
    need(cfg.long_prompts in rules, one_of("long_prompts", cfg.long_prompts, rules))


def validate_engine(engine: EngineOptions, need: Any) -> None:
    """Config problems of the engine fields (``need(cond, message)``)."""
    for problem in engine.problems():
        need(False, problem)
