"""Model and tokenizer I/O: load them from a local Hugging Face folder (never the hub), save a
model (LoRA adapters merged, a vision-language model's image processor beside it) atomically.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from gspo.core.atomic import replace_dir

from .lora import has_lora, merged_copy, save_lora
from .vision import save_processor

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _check_checkpoint_dir(path: str | Path, needed: tuple[str, ...]) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no checkpoint directory at {str(p)!r}")
    if not p.is_dir():
        raise ValueError(f"{str(p)!r} is a file, expected a checkpoint directory")
    if not any((p / name).exists() for name in needed):
        raise ValueError(f"{str(p)!r} is not a checkpoint directory (none of {list(needed)})")
    return p


def load_model(
    path: str | Path, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Load a causal LM from a local Hugging Face directory (never the hub)."""
    p = _check_checkpoint_dir(path, ("config.json",))
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; one of {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    # A vision-language checkpoint (Idefics3 / SmolVLM / Qwen2.5-VL) is an image-text model,
    # not a causal LM.
    config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    if getattr(config, "model_type", None) in ("idefics3", "smolvlm", "qwen2_5_vl"):
        from transformers import AutoModelForImageTextToText as auto
    else:
        auto = AutoModelForCausalLM
    model = auto.from_pretrained(str(p), dtype=dtype, local_files_only=True)
    return model.to(device)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local Hugging Face directory (never the hub)."""
    p = _check_checkpoint_dir(path, ("tokenizer.json", "tokenizer_config.json"))
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, path: str | Path
) -> None:
    """Save model (safetensors) and tokenizer to ``path`` with ``save_pretrained``.

    A model with LoRA adapters is saved merged (a plain Hugging Face model that
    ``transformers`` loads without peft), with the adapter itself in ``path/adapter``.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed into place: a kill mid-save never leaves a torn
    # model under the real name (an existing one is replaced only once the new one is complete).
    tmp = Path(tempfile.mkdtemp(dir=p.parent, prefix=f".tmp-{p.name}-"))
    try:
        if has_lora(model):
            save_lora(model, tmp / "adapter")
            model = merged_copy(model)
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        save_processor(model, tokenizer, tmp)  # a VL model's image processor goes with it

        replace_dir(tmp, p)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
