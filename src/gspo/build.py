"""Turn a config into the run's parts: device, policy model and tokenizer, task."""

from __future__ import annotations

import torch

from .models import build_char_tokenizer, build_tiny_model, load_model, load_tokenizer
from .models.text import decode_completions, encode_prompts  # noqa: F401  (re-exported)
from .tasks.base import Task

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but torch sees no CUDA device")
    return torch.device(name)


def set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def build_policy(cfg, device: torch.device):
    """(model, tokenizer): a random-init tiny dense or MoE model, or a local Hugging Face
    checkpoint."""
    if cfg.model in ("tiny", "tiny-moe"):
        tokenizer = build_char_tokenizer()
        experts = {}
        if cfg.model == "tiny-moe":
            experts = dict(
                num_experts=cfg.num_experts,
                top_k=cfg.experts_top_k,
                moe_intermediate_size=cfg.moe_intermediate_size,
                shared_expert=cfg.shared_expert,
            )
        model = build_tiny_model(
            len(tokenizer),
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            seed=cfg.seed,
            **experts,
        )
    else:
        # A named model (e.g. smollm2-135m-instruct, materialized once into the cache) or a
        # local Hugging Face checkpoint directory.
        from .pretrained import resolve_model_path

        path = resolve_model_path(cfg.model)
        tokenizer = load_tokenizer(path)
        model = load_model(path, dtype=cfg.dtype)
    ensure_pad_token(tokenizer)
    model = model.to(device=device, dtype=DTYPES[cfg.dtype])
    from .moe import fit_experts_kernel

    fit_experts_kernel(model)  # MoE: grouped_mm has no float64 kernel (no-op for dense models)
    if getattr(cfg, "lora_rank", 0) > 0:
        from .lora import apply_lora

        model = apply_lora(
            model,
            rank=cfg.lora_rank,
            alpha=cfg.lora_alpha,
            dropout=cfg.lora_dropout,
            target_modules=cfg.lora_target_modules,
            seed=cfg.seed,
        )
    return model, tokenizer


def ensure_pad_token(tokenizer) -> None:
    """Give a tokenizer without a pad token (Llama-style) its EOS as pad.

    Safe here because padding never reaches a loss unmasked: prompts are left-padded with an
    attention mask and completions carry an explicit completion mask, so a real EOS at the end
    of a completion stays in it (as the stop token) even when pad == eos.
    """
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token


def build_prompt_format(cfg, tokenizer, model=None):
    """The run's :class:`gspo.chat.PromptFormat` from ``cfg.chat_template`` and
    ``cfg.system_prompt`` (tiny char models: raw prompts, EOS as the only stop token)."""
    from .chat import prompt_format

    return prompt_format(
        tokenizer,
        mode=getattr(cfg, "chat_template", "auto"),
        system_prompt=getattr(cfg, "system_prompt", None),
        model=model,
    )


def build_task(cfg) -> Task:
    """A built-in synthetic task, or a task made of the user's data files."""
    if cfg.task == "file":
        from .tasks.files import make_file_task

        return make_file_task(
            cfg.train_file,
            cfg.test_file,
            cfg.reward,
            prompt_key=cfg.prompt_key,
            answer_key=cfg.answer_key,
            on_error="skip" if getattr(cfg, "bad_rows", "error") == "skip" else "raise",
            answer_format=getattr(cfg, "answer_format", "raw"),
            **({"demo_key": cfg.demo_key} if getattr(cfg, "demo_key", None) else {}),
        )
    from .tasks import make_task

    return make_task(
        cfg.task, n_train=cfg.n_train, n_test=cfg.n_test, seed=cfg.seed, difficulty=cfg.difficulty
    )


LONG_PROMPTS = ("error", "truncate", "skip")


def context_length(model) -> int | None:
    """Token positions the model was built for (``max_position_embeddings``), or None."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def prompt_token_limit(
    max_prompt_tokens: int, max_new_tokens: int, context: int | None
) -> tuple[int, str]:
    """(longest prompt in tokens, how to name that limit in messages).

    A prompt plus ``max_new_tokens`` must fit the model's context: ``max_prompt_tokens`` 0
    means exactly the room the context leaves; a larger explicit value is an error. Models
    without a known context keep ``max_prompt_tokens`` (0: no limit).
    """
    named = f"max_prompt_tokens={max_prompt_tokens}"
    if context is None:
        return max_prompt_tokens, named
    room = context - max_new_tokens
    if room < 1:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
            f"{context}-token context"
        )
    if max_prompt_tokens > room:
        raise ValueError(
            f"max_prompt_tokens={max_prompt_tokens} plus max_new_tokens={max_new_tokens} exceeds "
            f"the model's {context}-token context: set max_prompt_tokens <= {room} (0: {room})"
        )
    if max_prompt_tokens:
        return max_prompt_tokens, named
    return room, (
        f"the {room} tokens the model's {context}-token context leaves after "
        f"max_new_tokens={max_new_tokens}"
    )


def count_unknown(tokenizer, prompts: list[list[int]]) -> int:
    """How many encoded prompts hold the tokenizer's unknown token (characters it lacks)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    # Some tokenizers name a real special token (BOS/EOS) as their unk: nothing to count there.
    if unk is None or unk in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        return 0
    return sum(unk in ids for ids in prompts)


def limit_prompts(
    prompts: list[list[int]],
    max_tokens: int,
    policy: str,
    *,
    limit: str | None = None,
    what: str = "training problem",
) -> tuple[list[int], dict[int, list[int]], int, int]:
    """Apply a prompt-length limit (0 = none) to encoded prompts.

    Returns (indices kept, replacement ids for truncated prompts, n truncated, n skipped).
    ``truncate`` keeps the *last* ``max_tokens`` tokens (the end of a prompt, just before the
    answer, matters most); ``skip`` drops the problem; ``error`` raises naming the first one.
    """
    if policy not in LONG_PROMPTS:
        raise ValueError(f"long_prompts must be one of {', '.join(LONG_PROMPTS)}, got {policy!r}")
    if max_tokens <= 0:
        return list(range(len(prompts))), {}, 0, 0
    kept: list[int] = []
    replaced: dict[int, list[int]] = {}
    truncated = skipped = 0
    for i, ids in enumerate(prompts):
        if len(ids) <= max_tokens:
            kept.append(i)
        elif policy == "error":
            raise ValueError(
                f"{what} {i} has a {len(ids)}-token prompt, over "
                f"{limit or f'max_prompt_tokens={max_tokens}'} (set long_prompts to 'truncate' "
                "or 'skip' to accept such data)"
            )
        elif policy == "truncate":
            kept.append(i)
            replaced[i] = ids[-max_tokens:]
            truncated += 1
        else:
            skipped += 1
    return kept, replaced, truncated, skipped


def build_train_reward(cfg, task: Task):
    """The reward RL trains on: the task's reward, plus ``format_reward_weight`` x the format
    reward (answer in ``\\boxed{}`` or after ``####``) when that weight is non-zero."""
    weight = getattr(cfg, "format_reward_weight", 0.0)
    if not weight:
        return task.reward
    from .rewards import combine, format_reward

    return combine((task.reward, 1.0), (format_reward, weight))
