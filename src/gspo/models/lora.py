"""LoRA through peft (optional extra: ``pip install -c constraints.txt -e ".[lora]"``).

The adapter is injected into the model in place (``peft.inject_adapter_in_model``): the model
keeps its class and ``forward`` signature, so the rollout engine, ``token_logprobs``,
checkpoints and resume work on it unchanged, and only the LoRA matrices get gradients.
:func:`save_lora` writes the adapter in peft's format (``adapter_config.json`` +
``adapter_model.safetensors``, loadable with ``peft.PeftModel.from_pretrained``) and
:func:`merged_copy` gives a plain model with the adapter folded into the weights, which
``transformers`` loads without peft. ``peft`` is imported only when LoRA is asked for.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

__all__ = ["apply_lora", "has_lora", "merged_copy", "save_lora"]


def _peft():
    try:
        import peft
    except ImportError:
        raise ModuleNotFoundError(
            "LoRA (lora_rank > 0) needs peft: pip install -c constraints.txt -e '.[lora]'"
        ) from None
    return peft


def _targets(target_modules: str) -> str | list[str]:
    """``all-linear`` (every linear layer but the output head) or a comma-separated list."""
    if target_modules.strip() == "all-linear":
        return "all-linear"
    names = [t.strip() for t in target_modules.split(",") if t.strip()]
    if not names:
        raise ValueError(
            "lora_target_modules is empty; use 'all-linear' or names like q_proj,v_proj"
        )
    return names


def apply_lora(
    model: torch.nn.Module,
    *,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    target_modules: str = "all-linear",
    seed: int = 0,
) -> torch.nn.Module:
    """Inject LoRA adapters (B initialised to 0, so the model's outputs are unchanged) and
    freeze everything else. Returns the same model object.

    A's random init depends on ``seed`` only (the global RNG is left untouched), so a run and
    its resumed copy start from the same adapter."""
    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    peft = _peft()
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=_targets(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = peft.inject_adapter_in_model(config, model)
    except ValueError as exc:
        raise ValueError(
            f"LoRA target modules {target_modules!r} do not fit the model: {exc}"
        ) from None
    trainable = 0
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
        trainable += param.numel() if param.requires_grad else 0
    if trainable == 0:
        raise ValueError(f"LoRA with target modules {target_modules!r} adapted no layer")
    return model


def has_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries injected LoRA layers (without importing peft otherwise)."""
    return isinstance(getattr(model, "peft_config", None), dict) and any(
        "lora_" in name for name, _ in model.named_parameters()
    )


def _tuner_layers(model: torch.nn.Module) -> list[tuple[str, Any]]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with every LoRA update folded into its base weight and the LoRA
    layers replaced by the plain layers: the architecture ``from_pretrained`` expects."""
    merged = copy.deepcopy(model)
    with torch.no_grad():
        for name, layer in _tuner_layers(merged):
            layer.merge()
            parent_name, _, child = name.rpartition(".")
            parent = merged.get_submodule(parent_name) if parent_name else merged
            setattr(parent, child, layer.get_base_layer())
    merged.__dict__.pop("peft_config", None)
    for param in merged.parameters():
        param.requires_grad_(True)
    return merged


def save_lora(model: torch.nn.Module, path: str | Path) -> Path:
    """Write the adapter (peft format) to ``path``: ``adapter_config.json`` and
    ``adapter_model.safetensors``. ``base_model_name_or_path`` is left as the model's own
    ``name_or_path`` (the folder it was loaded from)."""
    peft = _peft()

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = model.peft_config["default"]
    config.base_model_name_or_path = getattr(model, "name_or_path", None) or None
    config.save_pretrained(str(out))
    state = peft.get_peft_model_state_dict(model, adapter_name="default")
    # PeftModel.save_pretrained names keys from the wrapper (base_model.model.<module path>);
    # our model is the inner model, so add that prefix for PeftModel.from_pretrained.
    state = {f"base_model.model.{k}": v for k, v in state.items()}
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in state.items()},
        str(out / "adapter_model.safetensors"),
    )
    return out
