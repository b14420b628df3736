"""Checkpoints: everything that defines a run at a step, written atomically, kept N deep.

Layout of ``<output_dir>/checkpoints/step_000050/``: the policy in Hugging Face format
(safetensors) with its tokenizer, ``optimizer.pt``, ``scheduler.pt``, ``rng.pt`` and
``state.json`` (step, config, metrics position). A checkpoint is built in a temporary folder
and renamed into place, so a crash mid-write never leaves a half checkpoint under a real name;
``latest`` is then replaced atomically.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from gspo.core.atomic import replace_dir  # also gspo.backend.checkpoint.replace_dir, as before
from gspo.core.checkpoint_paths import PREFIX, checkpoint_root, list_checkpoints
from gspo.models.vision import save_processor

from .base import CheckpointTarget

FAULT_DELAY_S = float(os.environ.get("GSPO_FAULT_CHECKPOINT_DELAY_S", "0"))
"""Seconds to pause inside every checkpoint write, before it is renamed into place. Only for
fault-injection tests (a SIGKILL during a write must never corrupt the last good checkpoint)."""


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    target: CheckpointTarget,
    step: int,
    model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` (``model``, ``optimizer``, ``scheduler``, RNG and
    ``extra``) atomically and prune all but the ``target.keep`` newest."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        if target.tokenizer is not None:
            target.tokenizer.save_pretrained(tmp)
        save_processor(model, target.tokenizer, tmp)  # a VL model's image processor goes with it
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")

    state = {"config": target.config, **(extra or {})}
    return write_checkpoint(target.output_dir, step, write=write, state=state, keep=target.keep)


def write_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    write: Callable[[Path], None],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """The atomic part of every backend's checkpoint: ``write(tmp)`` fills a temporary folder,
    then the RNG state and ``state.json`` (``step`` + ``state``) are added, every file is
    flushed and the folder renamed into place; ``latest`` then names it and all but the
    ``keep`` newest checkpoints are pruned. A kill at any point leaves the last complete one."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    for stale in root.glob(".tmp-*"):  # left by a process killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{final.name}-"))
    try:
        write(tmp)
        torch.save(rng_state(), tmp / "rng.pt")
        if FAULT_DELAY_S > 0:  # fault-injection hook: widens the window a kill can land in
            time.sleep(FAULT_DELAY_S)
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
        for f in tmp.rglob("*"):  # flush file contents before the rename makes them visible
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / "latest", final.name + "\n")
    for old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def clean_stale(output_dir: str | Path) -> None:
    """Remove what a killed process left mid-write: temporary checkpoint folders, a half
    written ``latest``, and the temporary folders of a model export (``final``)."""
    root = checkpoint_root(output_dir)
    leftovers = [*root.glob(".tmp-*"), *root.glob(".latest.*")] if root.is_dir() else []
    out = Path(output_dir)
    if out.is_dir():
        leftovers += [*out.glob(".tmp-final-*"), *out.glob(".tmp-old-final")]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def discard_run(output_dir: str | Path) -> None:
    """Before a new (not resumed) run in ``output_dir``: remove an earlier run's checkpoints
    and final model, so that a later resume can never pick up a checkpoint of another run."""
    out = Path(output_dir)
    for name in ("checkpoints", "final"):
        if (out / name).exists():
            shutil.rmtree(out / name)


def load_state(path: Path) -> dict[str, Any]:
    return json.loads((path / "state.json").read_text())


def restore(path: Path, *, model, optimizer, scheduler) -> dict[str, Any]:
    """Load weights, optimizer, scheduler and RNG states from ``path``; return its state.json."""
    weights = load_file(
        str(path / "model.safetensors"), device=str(next(model.parameters()).device)
    )
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied embeddings are stored once; anything else missing is a real mismatch.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"checkpoint {path} does not fit the model: missing {missing}, unexpected {unexpected}"
        )
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return load_state(path)
