"""Each component's options: typed, torch-free dataclasses cut from the flat ``TrainConfig``.

Users write one flat config (CLI flags, config-file keys: ``TrainConfig``); the composition root
splits it once (:func:`gspo.config.combinations.split`) and hands each layer only the options it
reads. A field's name, type, default and doc are the flat field's (one source: ``--help`` is
generated from ``TrainConfig``), so an option class only lists which fields it owns.

``problems()`` lists what is wrong with one component's own fields (messages as ``gspo train``
prints them); refusals of combinations across components are all in
:func:`gspo.config.combinations.combination_problems`. Checks against the task and reward
registries stay in :mod:`gspo.config.validation`, which may import them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from .eval_config import EvalConfig
from .fields import DTYPES, ROLLOUT_ENGINES
from .names import (
    CHAT_MODES,
    COMPARE_MODES,
    ROUTING_REPLAY,
    did_you_mean,
    one_of,
)
from .train import SFTConfig, TrainConfig

T = TypeVar("T")
_FLAT = {f.name: f for f in fields(TrainConfig)}


def _flat_fields(cls: type[T]) -> type[T]:
    """Give each annotated field of ``cls`` the flat field's default and doc, so option classes
    never restate (and drift from) what ``--help`` and config files show."""
    for name in cls.__annotations__:
        flat = _FLAT[name]  # KeyError: an option that is no TrainConfig field
        if flat.default_factory is not dataclasses.MISSING:
            made = dataclasses.field(default_factory=flat.default_factory, metadata=flat.metadata)
        else:
            made = dataclasses.field(default=flat.default, metadata=flat.metadata)
        setattr(cls, name, made)
    return cls


class _Options:
    @classmethod
    def of(cls: type[T], cfg: TrainConfig | SFTConfig | EvalConfig) -> T:
        """The options of ``cfg`` (a ``TrainConfig``; a config lacking some of these fields, such
        as ``EvalConfig``, gets their defaults: that config has no such choice)."""
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        present = {n: getattr(cfg, n) for n in names if n in type(cfg).__dataclass_fields__}
        return cls(**present)


def _collect() -> tuple[list[str], Any]:
    problems: list[str] = []

    def need(cond: bool, message: str) -> None:
        if not cond:
            problems.append(message)

    return problems, need


def device_ok(device: str) -> bool:
    return device in ("auto", "cpu", "cuda") or device.startswith("cuda:")


def bad_device(device: str) -> str:
    hint = did_you_mean(device, ("auto", "cpu", "cuda"))
    return f"bad device {device!r}{hint} (auto, cpu, cuda or cuda:N)"


@dataclass(frozen=True)
@_flat_fields
class RunOptions(_Options):
    """Where the run writes, its seed and device, its length, checkpoints and logging."""

    output_dir: str
    seed: int
    device: str
    threads: int
    steps: int
    eval_every: int
    checkpoint_every: int
    keep_checkpoints: int
    stop_after: int | None
    max_bad_steps: int
    progress: bool
    tensorboard: bool
    wandb: bool

    def problems(self) -> list[str]:
        problems, need = _collect()
        need(self.steps > 0, f"steps must be positive, got {self.steps}")
        need(device_ok(self.device), bad_device(self.device))
        need(self.threads >= 0, f"threads must be >= 0, got {self.threads}")
        need(
            self.eval_every >= 0 and self.checkpoint_every >= 0,
            "eval_every / checkpoint_every must be >= 0",
        )
        need(self.keep_checkpoints >= 1, "keep_checkpoints must be >= 1")
        need(self.max_bad_steps >= 1, "max_bad_steps must be >= 1")
        if self.stop_after is not None:
            need(self.stop_after > 0, "stop_after must be positive")
        return problems


@dataclass(frozen=True)
@_flat_fields
class ModelOptions(_Options):
    """The policy: which model, its dtype and shape, LoRA, MoE, prompt formatting."""

    model: str
    dtype: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    chat_template: str
    system_prompt: str | None
    lora_rank: int
    lora_alpha: float
    lora_dropout: float
    lora_target_modules: str
    num_experts: int
    experts_top_k: int
    moe_intermediate_size: int | None
    shared_expert: bool
    router_aux_loss_coef: float
    routing_replay: str | None

    def problems(self) -> list[str]:
        problems, need = _collect()
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            value = getattr(self, name)
            need(value > 0, f"{name} must be positive, got {value}")
        need(self.dtype in DTYPES, one_of("dtype", self.dtype, DTYPES))
        if self.hidden_size > 0 and self.num_heads > 0:
            need(
                self.hidden_size % self.num_heads == 0, "hidden_size must be divisible by num_heads"
            )
        if self.num_heads > 0 and self.num_kv_heads > 0:
            need(
                self.num_heads % self.num_kv_heads == 0,
                "num_heads must be divisible by num_kv_heads",
            )
        need(
            self.chat_template in CHAT_MODES,
            one_of("chat_template", self.chat_template, CHAT_MODES),
        )
        need(self.lora_rank >= 0, f"lora_rank must be >= 0, got {self.lora_rank}")
        need(self.lora_alpha > 0, f"lora_alpha must be positive, got {self.lora_alpha}")
        need(0 <= self.lora_dropout < 1, f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        need(self.num_experts > 0, f"num_experts must be positive, got {self.num_experts}")
        need(
            1 <= self.experts_top_k <= self.num_experts,
            f"experts_top_k must be in [1, num_experts={self.num_experts}], got {self.experts_top_k}",
        )
        if self.moe_intermediate_size is not None:
            need(self.moe_intermediate_size > 0, "moe_intermediate_size must be positive")
        need(self.router_aux_loss_coef >= 0, "router_aux_loss_coef must be >= 0")
        need(
            self.routing_replay is None or self.routing_replay in ROUTING_REPLAY,
            one_of("routing_replay", self.routing_replay, ROUTING_REPLAY),
        )
        need(
            self.routing_replay in (None, "none") or self.model != "tiny",
            f"routing_replay={self.routing_replay!r} needs an MoE model (e.g. model='tiny-moe')",
        )
        return problems


@dataclass(frozen=True)
@_flat_fields
class TaskOptions(_Options):
    """The task, its data files and prompts, and the multi-turn environments' limits."""

    task: str
    difficulty: int | None
    n_train: int
    n_test: int
    train_file: str | None
    test_file: str | None
    prompt_key: str
    answer_key: str
    image_key: str | None
    answer_format: str
    bad_rows: str
    max_prompt_tokens: int
    long_prompts: str
    dedupe: bool
    max_turns: int
    max_tokens_per_turn: int
    max_total_tokens: int
    env_timeout_s: float
    tool_timeout_s: float
    env: str | None
    plugins: tuple[str, ...]
    endpoint_host: str = "127.0.0.1"
    endpoint_port: int = 0
    episode_timeout_s: float = 600.0

    def problems(self) -> list[str]:
        problems, need = _collect()
        need(
            0 <= self.endpoint_port <= 65535,
            f"endpoint_port must be in 0..65535 (0: a free port), got {self.endpoint_port}",
        )
        need(bool(self.endpoint_host), "endpoint_host must be an address, e.g. 127.0.0.1")
        need(
            self.episode_timeout_s >= 0,
            f"episode_timeout_s must be >= 0 (0: no limit), got {self.episode_timeout_s}",
        )
        need(self.n_train > 0, f"n_train must be positive, got {self.n_train}")
        need(self.n_test > 0, f"n_test must be positive, got {self.n_test}")
        if self.task == "file":
            need(self.train_file is not None, "task='file' needs train_file")
        need(self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}")
        need(
            self.max_total_tokens >= 1,
            f"max_total_tokens must be >= 1, got {self.max_total_tokens}",
        )
        need(self.max_tokens_per_turn >= 0, "max_tokens_per_turn must be >= 0")
        need(
            self.bad_rows in ("error", "skip"), one_of("bad_rows", self.bad_rows, ("error", "skip"))
        )
        need(
            self.max_prompt_tokens >= 0,
            f"max_prompt_tokens must be >= 0, got {self.max_prompt_tokens}",
        )
        need(
            self.long_prompts in ("error", "truncate", "skip"),
            one_of("long_prompts", self.long_prompts, ("error", "truncate", "skip")),
        )
        return problems


@dataclass(frozen=True)
@_flat_fields
class RewardOptions(_Options):
    """How completions are scored: the reward, its limits, the code sandbox's limits."""

    reward: str | None
    reward_timeout_s: float
    reward_workers: int
    code_test_timeout_s: float
    code_total_timeout_s: float
    code_memory_mb: int
    code_run_memory_mb: int
    code_compare: str
    format_reward_weight: float

    def problems(self) -> list[str]:
        problems, need = _collect()
        need(
            self.reward_timeout_s >= 0,
            f"reward_timeout_s must be >= 0, got {self.reward_timeout_s}",
        )
        need(self.reward_workers >= 0, f"reward_workers must be >= 0, got {self.reward_workers}")
        test_s, total_s = self.code_test_timeout_s, self.code_total_timeout_s
        need(
            math.isfinite(test_s) and test_s > 0,
            f"code_test_timeout_s must be a positive number of seconds, got {test_s}",
        )
        need(
            math.isfinite(total_s) and total_s >= 0,
            "code_total_timeout_s must be >= 0 (0: per-test limit times tests + 2 s), "
            f"got {total_s}",
        )
        need(self.code_memory_mb >= 64, f"code_memory_mb must be >= 64, got {self.code_memory_mb}")
        need(
            self.code_run_memory_mb >= 64,
            f"code_run_memory_mb must be >= 64, got {self.code_run_memory_mb}",
        )
        need(
            self.code_compare in COMPARE_MODES,
            one_of("code_compare", self.code_compare, COMPARE_MODES),
        )
        need(
            math.isfinite(self.format_reward_weight),
            f"format_reward_weight must be finite, got {self.format_reward_weight}",
        )
        return problems


@dataclass(frozen=True)
@_flat_fields
class EngineOptions(_Options):
    """Which engine samples completions, and how vLLM is started."""

    rollout_engine: str
    vllm_dtype: str
    vllm_max_model_len: int | None
    vllm_gpu_memory_utilization: float
    vllm_enforce_eager: bool
    vllm_tensor_parallel_size: int
    vllm_cpu_kv_cache_gib: float
    vllm_multiprocess: bool
    engine_dtype: str | None

    def problems(self) -> list[str]:
        problems, need = _collect()
        engine = self.rollout_engine
        need(engine in ROLLOUT_ENGINES, one_of("rollout_engine", engine, ROLLOUT_ENGINES, "engine"))
        need(
            self.vllm_dtype in ("float32", "bfloat16", "float16"),
            f"vllm_dtype must be float32, bfloat16 or float16, got {self.vllm_dtype!r}",
        )
        if self.vllm_max_model_len is not None:
            need(self.vllm_max_model_len > 0, "vllm_max_model_len must be positive")
        need(
            0 < self.vllm_gpu_memory_utilization <= 1,
            "vllm_gpu_memory_utilization must be in (0, 1]",
        )
        need(self.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size must be >= 1")
        need(self.vllm_cpu_kv_cache_gib > 0, "vllm_cpu_kv_cache_gib must be positive")
        if self.engine_dtype is not None:
            need(self.engine_dtype in DTYPES, one_of("engine_dtype", self.engine_dtype, DTYPES))
        return problems
