"""Turn a config into the run's parts: device, policy model and tokenizer, task."""

from __future__ import annotations

import torch

from .models import build_char_tokenizer, build_tiny_model, load_model, load_tokenizer
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
    """(model, tokenizer): a random-init tiny model or a local Hugging Face checkpoint."""
    if cfg.model == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(
            len(tokenizer),
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            seed=cfg.seed,
        )
    else:
        tokenizer = load_tokenizer(cfg.model)
        model = load_model(cfg.model, dtype="float32")
    model = model.to(device=device, dtype=DTYPES[cfg.dtype])
    return model, tokenizer


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
            **({"demo_key": cfg.demo_key} if getattr(cfg, "demo_key", None) else {}),
        )
    from .tasks import make_task

    return make_task(
        cfg.task, n_train=cfg.n_train, n_test=cfg.n_test, seed=cfg.seed, difficulty=cfg.difficulty
    )


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt (special tokens such as <bos> included), no padding."""
    return [list(ids) for ids in tokenizer(prompts, add_special_tokens=True)["input_ids"]]


def decode_completions(
    tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> list[str]:
    """Completion texts without padding and special tokens (EOS is not part of the answer)."""
    rows = [
        ids[m].tolist()
        for ids, m in zip(completion_ids.cpu(), completion_mask.cpu().bool(), strict=True)
    ]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
