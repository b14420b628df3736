"""Atomic folder replacement, shared by model saving (``gspo.models.model_io``) and checkpoints
(``gspo.backend.checkpoint``): a crash at any point leaves one complete copy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def replace_dir(src: Path, dst: Path) -> None:
    """Rename the complete folder ``src`` to ``dst``; an existing ``dst`` is moved aside first
    and removed only afterwards, so a crash at any point leaves one complete copy."""
    if dst.exists():
        aside = dst.parent / f".tmp-old-{dst.name}"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(dst, aside)
        os.rename(src, dst)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(src, dst)
