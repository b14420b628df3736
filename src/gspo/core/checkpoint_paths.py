"""Where a run's checkpoints are: ``<output_dir>/checkpoints/step_000050/``, complete ones
being those with a ``state.json`` (:mod:`gspo.backend.checkpoint` writes them). Paths only,
no torch: the ``--resume`` checks (``gspo.compose.resume``) and the CLI read them before torch
is imported."""

from __future__ import annotations

from pathlib import Path

PREFIX = "step_"


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders of interrupted writes are ignored)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    done = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").is_file()
    ]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None
