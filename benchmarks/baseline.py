"""Another commit's gspo beside the current one, for ``--baseline REF`` (``benchmarks/vs_trl.py``,
``benchmarks/growth.py``): a detached git worktree of REF in a temp folder, removed afterwards.
Runs of the baseline import ``gspo`` from ``<worktree>/src`` (``PYTHONPATH``), runs of the
current checkout from this checkout's ``src``, so a regression between two commits shows in one
alternating run, on one machine, under one load.

The benchmark's own code (its workloads, its timing) is the current checkout's for both: only
the package under test changes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The checkout this benchmark lies in (its ``src`` is the "current" gspo)."""
SEP = "@"
"""``gspo@REF`` names a system run on the baseline commit REF."""


class BaselineError(ValueError):
    """REF is not a commit of the repository (or git is missing): one line for the user."""


def _git(repo: Path, *args: str) -> str:
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError as err:
        raise BaselineError("--baseline needs git on PATH") from err
    if proc.returncode != 0:
        raise BaselineError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")
    return proc.stdout.strip()


def resolve(ref: str, repo: Path | None = None) -> str:
    """The short commit id of REF, or BaselineError naming REF."""
    repo = repo or REPO
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", "--short", f"{ref}^{{commit}}")
    except BaselineError as err:
        raise BaselineError(f"--baseline {ref!r}: not a commit of {repo.name} ({err})") from None


def split(system: str) -> tuple[str, str | None]:
    """``"gspo@abc123"`` -> ``("gspo", "abc123")``; ``"gspo"`` -> ``("gspo", None)``."""
    name, _, ref = system.partition(SEP)
    return name, ref or None


def baseline_systems(systems: list[str], ref: str) -> list[str]:
    """Each gspo system followed by its baseline twin (TRL has none: it is not ours)."""
    out: list[str] = []
    for system in systems:
        out.append(system)
        if system.startswith("gspo"):
            out.append(f"{system}{SEP}{ref}")
    return out


def src_for(system: str, worktrees: dict[str, Path], repo: Path | None = None) -> Path:
    """The ``src`` folder a system's subprocess imports gspo from."""
    repo = repo or REPO
    _, ref = split(system)
    return (worktrees[ref] if ref else repo) / "src"


def env_with_src(env: dict[str, str], src: Path) -> dict[str, str]:
    """``env`` with ``src`` first on ``PYTHONPATH`` (ahead of any installed gspo)."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join([str(src), *rest])}


@contextlib.contextmanager
def worktree(ref: str, repo: Path | None = None) -> Iterator[Path]:
    """A detached worktree of ``ref`` (a resolved commit) in a temp folder; always removed."""
    repo = repo or REPO
    parent = Path(tempfile.mkdtemp(prefix="gspo-baseline-"))
    path = parent / ref
    _git(repo, "worktree", "add", "--detach", "--quiet", str(path), ref)
    try:
        yield path
    finally:
        with contextlib.suppress(BaselineError):
            _git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)
        with contextlib.suppress(BaselineError):
            _git(repo, "worktree", "prune")


def speed_ratios(step_s: dict[str, float | None]) -> dict[str, float | None]:
    """For each system with a baseline twin in ``step_s`` (system -> seconds per step): the
    current commit's speed over the baseline's (baseline s/step / current s/step; > 1 is
    faster now)."""
    out: dict[str, float | None] = {}
    for system, base in step_s.items():
        current_name, ref = split(system)
        if ref is None or current_name not in step_s:
            continue
        current = step_s[current_name]
        out[current_name] = base / current if base and current else None
    return out
