"""Plain config data: ``TrainConfig`` (an RL run, composed of its components' options) and
``SFTConfig`` (a supervised cold start, flat).

``TrainConfig``'s fields are the option classes (``cfg.loss.algo``, ``cfg.rollout.group_size``);
its flat names, the CLI flags and config-file keys, are those classes' fields
(:func:`gspo.config.fields.flat_fields`). ``SFTConfig`` and ``EvalConfig`` are flat: their
shared groups below are picked from the option classes, where each field is declared, and the
episode limits are a base class of theirs and of ``TaskOptions`` (``EpisodeLimits``). This
module imports nothing else of gspo but the config's plain-data modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .fields import _doc, compose, field_group
from .options import EngineOptions, ModelOptions, RunOptions
from .options_task import EpisodeLimits, RewardOptions, TaskOptions
from .options_train import AsyncOptions, BackendOptions, LossOptions, OptimOptions, RolloutOptions


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines an RL run, one object per component; saved (flat) with every
    checkpoint. Build one from flat or nested values with :meth:`of`."""

    run: RunOptions = field(default_factory=RunOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    task: TaskOptions = field(default_factory=TaskOptions)
    reward: RewardOptions = field(default_factory=RewardOptions)
    rollout: RolloutOptions = field(default_factory=RolloutOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    optim: OptimOptions = field(default_factory=OptimOptions)
    # The docs' order (--help, config.json): the objective, then async, the engine and Ray.
    asynchronous: AsyncOptions = field(default_factory=AsyncOptions)
    engine: EngineOptions = field(default_factory=EngineOptions)
    backend: BackendOptions = field(default_factory=BackendOptions)

    @classmethod
    def of(cls, **values: Any) -> TrainConfig:
        """A config from flat values (``algo="grpo"``), nested ones (``loss={"algo": "grpo"}``)
        or whole parts, the rest default; unchecked (``gspo.config.build`` coerces and checks)."""
        return compose(cls, values)

    def parts(self) -> tuple:
        return (
            self.run,
            self.model,
            self.task,
            self.reward,
            self.engine,
            self.rollout,
            self.loss,
            self.optim,
            self.backend,
            self.asynchronous,
        )


_MODULE = __name__

SharedFields = field_group(
    "SharedFields",
    (RunOptions, ModelOptions, TaskOptions, RewardOptions),
    (
        *("output_dir", "seed", "device", "threads"),
        *("model", "dtype", "hidden_size", "num_layers", "num_heads", "num_kv_heads"),
        *("chat_template", "system_prompt", "lora_rank", "lora_alpha", "lora_dropout"),
        *("lora_target_modules", "num_experts", "experts_top_k", "moe_intermediate_size"),
        *("shared_expert", "router_aux_loss_coef"),
        *("task", "difficulty", "n_train", "n_test", "train_file", "test_file", "prompt_key"),
        *("answer_key", "image_key", "answer_format", "reward", "dedupe", "env", "plugins"),
    ),
    """Run, model and task fields common to ``gspo train`` and ``gspo sft``.""",
    _MODULE,
)

EngineFields = field_group(
    "EngineFields",
    (EngineOptions,),
    (
        *("rollout_engine", "vllm_dtype", "vllm_max_model_len", "vllm_gpu_memory_utilization"),
        *("vllm_enforce_eager", "vllm_tensor_parallel_size", "vllm_cpu_kv_cache_gib"),
        "vllm_multiprocess",
    ),
    """Which engine samples completions, and how vLLM is started (``gspo eval``).""",
    _MODULE,
)

EPISODE_LIMITS = tuple(f.name for f in fields(EpisodeLimits))


@dataclass(frozen=True)
class SFTConfig(SharedFields, EpisodeLimits):
    """Supervised cold start on a task's demonstrations (run, model and task: SharedFields)."""

    output_dir: str = _doc("Folder for the fine-tuned model.", "runs/sft")
    n_test: int = _doc("Held-out problems for the accuracy printed at the end; 0: skip it.", 200)
    demo_key: str | None = _doc("Demonstration column; None uses the answer as the target.", None)
    steps: int = _doc("Optimizer steps.", 200)
    batch_size: int = _doc("Sequences per step.", 256)
    lr: float = _doc("AdamW learning rate.", 3e-3)
    warmup_steps: int = _doc("Linear warm-up steps.", 10)
    max_new_tokens: int = _doc("Completion length used when measuring held-out accuracy.", 8)
    long_prompts: str = _doc(
        "Demonstrations whose prompt + demonstration exceed the model's context (held-out "
        "prompts: prompt + max_new_tokens): 'error' (stop, naming the row), 'truncate' (keep "
        "the prompt's end) or 'skip'.",
        "error",
    )
    progress: bool = _doc("Show a live progress bar.", True)
    checkpoint_every: int = _doc(
        "Resumable checkpoint (in output_dir/checkpoints, until the model is saved) every N "
        "steps; 0: only when SIGINT / SIGTERM stop it.",
        50,
    )


SFT_SAFE_ON_RESUME = frozenset(
    {"output_dir", "steps", "checkpoint_every", "progress", "threads", *EPISODE_LIMITS}
)
"""Fields a resumed SFT may change: its learning rate is warm-up then constant, so more steps
continue the same run; the episode limits only shape the final held-out score; the rest decide
what each step computes."""
