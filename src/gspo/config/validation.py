"""Config validation: every problem of a config, listed in one ``ConfigError`` before any work.

Registry names (losses, advantage scales, chat modes, Routing Replay modes, KL estimators,
multi-turn credit) come from :mod:`gspo.config.names`, which needs no torch; the task, reward and
answer-format registries are torch-free themselves and are imported inside the functions. So a
config mistake is reported in well under a second, and the plain-data modules (``fields``,
``train``, ``evaluation``, ``presets``) import nothing else.
"""

from __future__ import annotations

import math
from typing import Any

from .asynchronous import async_problems
from .eval_config import EvalConfig
from .fields import (
    CORRECTIONS,
    DTYPES,
    MINIBATCH_GROUPINGS,
    OLD_LOGPROBS,
    ROLLOUT_ENGINES,
    ConfigError,
)
from .names import (
    ADVANTAGE_SCALES,
    CHAT_MODES,
    COMPARE_MODES,
    CREDITS,
    KL_ESTIMATORS,
    MISMATCH_LEVELS,
    ROUTING_REPLAY,
    did_you_mean,
    losses,
    one_of,
)
from .scale import scale_problems
from .train import SFTConfig, TrainConfig


def config_error(problems: list[str], header: str = "invalid config") -> ConfigError:
    """One problem on one line; several listed together, one per line."""
    if len(problems) == 1:
        return ConfigError(f"{header}: {problems[0]}")
    return ConfigError(f"{header}:\n  - " + "\n  - ".join(problems))


def _check_code_limits(cfg: Any, need: Any) -> None:
    """The code reward's limits (TrainConfig's code_* fields)."""
    test_s, total_s = cfg.code_test_timeout_s, cfg.code_total_timeout_s
    need(
        math.isfinite(test_s) and test_s > 0,
        f"code_test_timeout_s must be a positive number of seconds, got {test_s}",
    )
    need(
        math.isfinite(total_s) and total_s >= 0,
        f"code_total_timeout_s must be >= 0 (0: per-test limit times tests + 2 s), got {total_s}",
    )
    need(cfg.code_memory_mb >= 64, f"code_memory_mb must be >= 64, got {cfg.code_memory_mb}")
    need(
        cfg.code_run_memory_mb >= 64,
        f"code_run_memory_mb must be >= 64, got {cfg.code_run_memory_mb}",
    )
    need(cfg.code_compare in COMPARE_MODES, one_of("code_compare", cfg.code_compare, COMPARE_MODES))


def validate(cfg: Any) -> None:
    """Raise ConfigError listing every problem in ``cfg``."""
    problems = config_problems(cfg)
    if problems:
        raise config_error(problems)


def config_problems(cfg: Any) -> list[str]:
    """Every problem in ``cfg`` (empty: fine)."""
    problems: list[str] = []

    def need(cond: bool, message: str) -> None:
        if not cond:
            problems.append(message)

    _validate_model_fields(cfg, need)
    validate_engine(cfg, need)  # rollout_engine, vllm_*, mismatch_* fields
    _validate_task(cfg, need)
    if isinstance(cfg, EvalConfig):
        _validate_eval(cfg, need)
        return problems
    positive = [
        "n_train",
        *([] if isinstance(cfg, SFTConfig) else ["n_test"]),  # SFT: 0 skips its final eval
        "steps",
        "max_new_tokens",
        "hidden_size",
        "num_layers",
        "num_heads",
    ]
    positive += ["num_kv_heads"]
    if isinstance(cfg, TrainConfig):
        positive += ["prompts_per_step", "num_minibatches"]  # group_size: its own >= 2 check
    else:
        positive += ["batch_size"]
    for name in positive:
        need(getattr(cfg, name) > 0, f"{name} must be positive, got {getattr(cfg, name)}")
    if isinstance(cfg, SFTConfig):
        need(cfg.n_test >= 0, f"n_test must be >= 0, got {cfg.n_test}")
        need(
            cfg.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {cfg.checkpoint_every}"
        )
    need(cfg.lr > 0, f"lr must be positive, got {cfg.lr}")
    need(cfg.warmup_steps >= 0, f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    need(cfg.dtype in DTYPES, one_of("dtype", cfg.dtype, DTYPES))
    need(_device_ok(cfg.device), _bad_device(cfg.device))
    need(cfg.threads >= 0, f"threads must be >= 0, got {cfg.threads}")
    if cfg.hidden_size > 0 and cfg.num_heads > 0:
        need(cfg.hidden_size % cfg.num_heads == 0, "hidden_size must be divisible by num_heads")
    if cfg.num_heads > 0 and cfg.num_kv_heads > 0:
        need(cfg.num_heads % cfg.num_kv_heads == 0, "num_heads must be divisible by num_kv_heads")
    if cfg.task == "file":
        need(cfg.train_file is not None, "task='file' needs train_file")
        from gspo.envs.rewards import REWARDS  # on use: see _validate_task

        need(cfg.reward is not None, f"task='file' needs reward, one of {', '.join(REWARDS)}")
    _validate_moe(cfg, need)
    if isinstance(cfg, TrainConfig):
        _validate_train(cfg, need)
        # The mixins' own checks (their __post_init__ raises at the first failing mixin; here
        # every one is listed, for a config built without them by coercion.build).
        problems += [p for p in (*scale_problems(cfg), *async_problems(cfg)) if p not in problems]
    return problems


def _device_ok(device: str) -> bool:
    return device in ("auto", "cpu", "cuda") or device.startswith("cuda:")


def _bad_device(device: str) -> str:
    hint = did_you_mean(device, ("auto", "cpu", "cuda"))
    return f"bad device {device!r}{hint} (auto, cpu, cuda or cuda:N)"


def _validate_task(cfg: Any, need: Any) -> None:
    """The task and reward names, against their registries (torch-free modules)."""
    # Imported on use, here and below: any import of a gspo.config module runs this package,
    # and every layer imports one; the registries live in gspo.envs, above most of them.
    from gspo.envs.rewards import REWARDS
    from gspo.envs.tasks import TASKS

    files = ("file",) if not isinstance(cfg, EvalConfig) else ()  # eval reads --data instead
    tasks = (*TASKS, *files)
    need(cfg.task in tasks, one_of("task", cfg.task, tasks, noun="task"))
    if cfg.reward is not None:
        need(cfg.reward in REWARDS, one_of("reward", cfg.reward, REWARDS, noun="reward"))


def _validate_moe(cfg: Any, need: Any) -> None:
    need(cfg.num_experts > 0, f"num_experts must be positive, got {cfg.num_experts}")
    need(
        1 <= cfg.experts_top_k <= cfg.num_experts,
        f"experts_top_k must be in [1, num_experts={cfg.num_experts}], got {cfg.experts_top_k}",
    )
    if cfg.moe_intermediate_size is not None:
        need(cfg.moe_intermediate_size > 0, "moe_intermediate_size must be positive")
    need(cfg.router_aux_loss_coef >= 0, "router_aux_loss_coef must be >= 0")
    if isinstance(cfg, TrainConfig):
        need(
            cfg.routing_replay is None or cfg.routing_replay in ROUTING_REPLAY,
            one_of("routing_replay", cfg.routing_replay, ROUTING_REPLAY),
        )
        need(
            cfg.routing_replay != "old" or cfg.old_logprobs == "recompute",
            "routing_replay='old' (R2) replays the routing of the old log-prob recompute pass: "
            "set old_logprobs='recompute', or use routing_replay='engine' (R3)",
        )
        need(
            cfg.routing_replay in (None, "none") or cfg.model != "tiny",
            f"routing_replay={cfg.routing_replay!r} needs an MoE model (e.g. model='tiny-moe')",
        )


def _validate_model_fields(cfg: Any, need: Any) -> None:
    """Prompt formatting, LoRA and answer-format fields shared by the train, SFT and eval configs."""
    from gspo.envs.tasks.files import ANSWER_FORMATS  # on use: see _validate_task

    need(cfg.chat_template in CHAT_MODES, one_of("chat_template", cfg.chat_template, CHAT_MODES))
    need(
        cfg.answer_format in ANSWER_FORMATS,
        one_of("answer_format", cfg.answer_format, ANSWER_FORMATS),
    )
    if hasattr(cfg, "lora_rank"):
        need(cfg.lora_rank >= 0, f"lora_rank must be >= 0, got {cfg.lora_rank}")
        need(cfg.lora_alpha > 0, f"lora_alpha must be positive, got {cfg.lora_alpha}")
        need(0 <= cfg.lora_dropout < 1, f"lora_dropout must be in [0, 1), got {cfg.lora_dropout}")


def _validate_eval(cfg: EvalConfig, need: Any) -> None:
    for name in ("n_test", "max_new_tokens", "batch_size"):
        need(getattr(cfg, name) > 0, f"{name} must be positive, got {getattr(cfg, name)}")
    for name in ("samples", "limit", "show", "threads"):
        need(getattr(cfg, name) >= 0, f"{name} must be >= 0, got {getattr(cfg, name)}")
    need(cfg.samples > 0 or cfg.greedy, "nothing to score: samples is 0 and greedy is off")
    need(cfg.dtype in DTYPES, one_of("dtype", cfg.dtype, DTYPES))
    need(_device_ok(cfg.device), _bad_device(cfg.device))
    need(cfg.temperature >= 0, f"temperature must be >= 0, got {cfg.temperature}")
    need(0 < cfg.top_p <= 1, f"top_p must be in (0, 1], got {cfg.top_p}")


def _validate_train(cfg: TrainConfig, need: Any) -> None:
    LOSSES = losses()
    need(cfg.algo in LOSSES, one_of("algo", cfg.algo, sorted(LOSSES), noun="algorithm"))
    if cfg.algo in LOSSES:
        spec = LOSSES[cfg.algo]
        if cfg.aggregation is not None:
            need(
                cfg.aggregation in spec.aggregations,
                f"algo {cfg.algo} supports aggregation {', '.join(spec.aggregations)}, got {cfg.aggregation!r}",
            )
    if cfg.clip_low is not None:
        need(cfg.clip_low >= 0, f"clip_low must be >= 0, got {cfg.clip_low}")
    validate_options(cfg, need)
    if cfg.clip_high is not None:
        need(cfg.clip_high >= 0, f"clip_high must be >= 0, got {cfg.clip_high}")
    need(
        cfg.advantage_scale in ADVANTAGE_SCALES,
        one_of("advantage_scale", cfg.advantage_scale, ADVANTAGE_SCALES),
    )
    # Multi-turn credit, as gspo.envs.credit.credit_problem (which needs torch) checks it.
    need(cfg.credit in CREDITS, one_of("credit", cfg.credit, CREDITS))
    if cfg.credit == "turn" and cfg.algo in LOSSES:
        need(
            LOSSES[cfg.algo].token_advantages,
            "credit='turn' gives each turn its own advantage, which needs a token-level loss "
            f"('gspo_token' or 'grpo'); algo={cfg.algo!r} takes one advantage per sequence "
            "(use credit='episode' with it)",
        )
    need(cfg.max_turns >= 1, f"max_turns must be >= 1, got {cfg.max_turns}")
    need(cfg.max_total_tokens >= 1, f"max_total_tokens must be >= 1, got {cfg.max_total_tokens}")
    need(cfg.max_tokens_per_turn >= 0, "max_tokens_per_turn must be >= 0")
    need(0 <= cfg.turn_discount <= 1, f"turn_discount must be in [0, 1], got {cfg.turn_discount}")
    need(cfg.kl_coef >= 0, f"kl_coef must be >= 0, got {cfg.kl_coef}")
    need(
        0 <= cfg.overlong_buffer <= cfg.max_new_tokens,
        "overlong_buffer must be in [0, max_new_tokens]",
    )
    need(cfg.temperature >= 0, f"temperature must be >= 0, got {cfg.temperature}")
    need(0 < cfg.top_p <= 1, f"top_p must be in (0, 1], got {cfg.top_p}")
    need(cfg.old_logprobs in OLD_LOGPROBS, one_of("old_logprobs", cfg.old_logprobs, OLD_LOGPROBS))
    if cfg.engine_dtype is not None:
        need(cfg.engine_dtype in DTYPES, one_of("engine_dtype", cfg.engine_dtype, DTYPES))
    batch = cfg.prompts_per_step * cfg.group_size
    if cfg.num_minibatches > 0 and batch > 0:
        need(
            batch % cfg.num_minibatches == 0,
            f"prompts_per_step x group_size = {batch} must be divisible by num_minibatches={cfg.num_minibatches}",
        )
    need(
        cfg.minibatch_grouping in MINIBATCH_GROUPINGS,
        one_of("minibatch_grouping", cfg.minibatch_grouping, MINIBATCH_GROUPINGS),
    )
    if cfg.minibatch_grouping == "groups" and cfg.num_minibatches > 0:
        need(
            cfg.prompts_per_step % cfg.num_minibatches == 0,
            f"minibatch_grouping='groups' keeps groups whole: prompts_per_step={cfg.prompts_per_step} "
            f"must be divisible by num_minibatches={cfg.num_minibatches}",
        )
    need(
        0.0 <= cfg.zero_advantage_split <= 1.0,
        f"zero_advantage_split must be in [0, 1], got {cfg.zero_advantage_split}",
    )
    need(cfg.micro_batch_size >= 0, "micro_batch_size must be >= 0")
    need(cfg.max_grad_norm >= 0, "max_grad_norm must be >= 0")
    need(cfg.weight_decay >= 0, "weight_decay must be >= 0")
    need(0 <= cfg.adam_beta1 < 1 and 0 <= cfg.adam_beta2 < 1, "adam betas must be in [0, 1)")
    need(
        cfg.eval_every >= 0 and cfg.checkpoint_every >= 0,
        "eval_every / checkpoint_every must be >= 0",
    )
    need(cfg.keep_checkpoints >= 1, "keep_checkpoints must be >= 1")
    need(
        math.isfinite(cfg.format_reward_weight),
        f"format_reward_weight must be finite, got {cfg.format_reward_weight}",
    )
    if cfg.format_reward_weight:  # a task with its own environment: the env gives the rewards
        from gspo.envs.base import format_bonus_problem  # on use: see _validate_task

        problem = format_bonus_problem(cfg.task, cfg.format_reward_weight)
        need(problem is None, problem or "")
    need(cfg.max_bad_steps >= 1, "max_bad_steps must be >= 1")
    need(cfg.bad_rows in ("error", "skip"), one_of("bad_rows", cfg.bad_rows, ("error", "skip")))
    need(cfg.reward_timeout_s >= 0, f"reward_timeout_s must be >= 0, got {cfg.reward_timeout_s}")
    need(cfg.reward_workers >= 0, f"reward_workers must be >= 0, got {cfg.reward_workers}")
    _check_code_limits(cfg, need)
    need(cfg.max_prompt_tokens >= 0, f"max_prompt_tokens must be >= 0, got {cfg.max_prompt_tokens}")
    need(
        cfg.long_prompts in ("error", "truncate", "skip"),
        one_of("long_prompts", cfg.long_prompts, ("error", "truncate", "skip")),
    )
    need(
        cfg.group_size >= 2,
        f"group_size must be >= 2 (group-normalized advantages compare responses to the same prompt), got {cfg.group_size}",
    )
    if cfg.stop_after is not None:
        need(cfg.stop_after > 0, "stop_after must be positive")
    if cfg.loss_constant is not None:
        need(cfg.loss_constant > 0, "loss_constant must be positive")


def validate_engine(cfg: Any, need: Any) -> None:
    """Config problems of the engine and correction fields (``need(cond, message)``)."""
    engine = getattr(cfg, "rollout_engine", "torch")
    need(engine in ROLLOUT_ENGINES, one_of("rollout_engine", engine, ROLLOUT_ENGINES, "engine"))
    if hasattr(cfg, "vllm_dtype"):
        need(
            cfg.vllm_dtype in ("float32", "bfloat16", "float16"),
            f"vllm_dtype must be float32, bfloat16 or float16, got {cfg.vllm_dtype!r}",
        )
        if cfg.vllm_max_model_len is not None:
            need(cfg.vllm_max_model_len > 0, "vllm_max_model_len must be positive")
        need(
            0 < cfg.vllm_gpu_memory_utilization <= 1,
            "vllm_gpu_memory_utilization must be in (0, 1]",
        )
        need(cfg.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size must be >= 1")
        need(cfg.vllm_cpu_kv_cache_gib > 0, "vllm_cpu_kv_cache_gib must be positive")
    if engine == "vllm" and hasattr(cfg, "old_logprobs"):  # training
        need(
            cfg.top_p == 1.0,
            f"rollout_engine='vllm' with top_p={cfg.top_p}: vLLM's log-probs are of the "
            "top-p-truncated distribution, the trainer's of the full one (biased ratios); use "
            "top_p=1 or rollout_engine='torch'",
        )
        need(
            getattr(cfg, "routing_replay", None) != "engine",
            "routing_replay='engine' (R3) with rollout_engine='vllm': vLLM 0.32 records no expert "
            "choices on CPU (its enable_return_routed_experts output exists only in the GPU "
            "model runner and is not wired here); use routing_replay='old' (R2, with "
            "old_logprobs='recompute') or rollout_engine='torch'",
        )
        need(
            getattr(cfg, "engine_dtype", None) is None,
            "engine_dtype is the torch engine's copy dtype; with rollout_engine='vllm' set "
            "vllm_dtype instead",
        )
    if hasattr(cfg, "mismatch_correction"):
        need(
            cfg.mismatch_correction in (None, *CORRECTIONS),
            one_of("mismatch_correction", cfg.mismatch_correction, ("none", *CORRECTIONS)),
        )
        need(
            cfg.mismatch_level in MISMATCH_LEVELS,
            one_of("mismatch_level", cfg.mismatch_level, MISMATCH_LEVELS),
        )
        need(cfg.mismatch_cap > 0, f"mismatch_cap must be positive, got {cfg.mismatch_cap}")
        if cfg.mismatch_floor is not None:
            need(
                0 <= cfg.mismatch_floor <= cfg.mismatch_cap,
                f"mismatch_floor must be in [0, mismatch_cap], got {cfg.mismatch_floor}",
            )
        need(
            cfg.mismatch_correction is None or cfg.old_logprobs == "recompute",
            f"mismatch_correction={cfg.mismatch_correction!r} compares the trainer's old "
            "log-probs with the engine's: set old_logprobs='recompute'",
        )


def validate_options(cfg: Any, need: Any) -> None:
    """Config checks of the options (``need(condition, message)`` collects the problems)."""
    spec = losses().get(cfg.algo)
    need(cfg.kl_estimator in KL_ESTIMATORS, one_of("kl_estimator", cfg.kl_estimator, KL_ESTIMATORS))
    if spec is not None:
        clip_set = cfg.clip_low is not None or cfg.clip_high is not None
        need(
            spec.clip_meaning != "unused" or not clip_set,
            f"algo {cfg.algo} has no clip range: leave clip_low/clip_high unset "
            "(its gate temperatures are sapo_tau_pos/sapo_tau_neg)",
        )
        need(
            cfg.dual_clip is None or "dual_clip" in dict(spec.options),
            f"dual_clip applies to grpo only, not to algo {cfg.algo}",
        )
    if cfg.clip_low is not None and (spec is None or spec.clip_meaning in ("ratio", "weight")):
        # 1 - ε_low bounds a ratio from below (1: no lower bound); only GMPO's log-space ε may
        # exceed 1.
        need(cfg.clip_low <= 1, f"clip_low must be in [0, 1], got {cfg.clip_low}")
    need(cfg.dual_clip is None or cfg.dual_clip > 1, f"dual_clip must be > 1, got {cfg.dual_clip}")
    need(
        cfg.sapo_tau_pos > 0 and cfg.sapo_tau_neg > 0,
        f"sapo_tau_pos/sapo_tau_neg must be positive, got {cfg.sapo_tau_pos}, {cfg.sapo_tau_neg}",
    )
    need(
        cfg.off_policy_mask_delta >= 0,
        f"off_policy_mask_delta must be >= 0, got {cfg.off_policy_mask_delta}",
    )
    need(
        cfg.dynamic_sampling_rounds >= 1,
        f"dynamic_sampling_rounds must be >= 1, got {cfg.dynamic_sampling_rounds}",
    )
    need(
        not cfg.kl_in_reward or cfg.kl_coef > 0,
        "kl_in_reward needs kl_coef > 0 (the β of the penalty)",
    )
