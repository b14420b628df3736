"""One run per output folder: a new run into a folder that holds one is refused (``--resume``
continues it, ``--overwrite`` moves it aside first), and Ctrl-C / SIGTERM end with one line.

Imports nothing heavy: the refusal comes before torch and the model load.
"""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from gspo.config import ConfigError
from gspo.core.checkpoint_paths import latest_checkpoint

RUN_FILES = (
    "metrics.jsonl",
    "config.json",
    "checkpoints",
    "final",
    "model.safetensors",
    "summary.json",
    "demo.json",
    "sft",
    "rl",
)
"""What gspo writes into an output folder (RL run, SFT model, demo): any one marks a run."""

OVERWRITE_HELP = (
    "start a new run even if --output-dir holds one: the earlier run is first moved aside to "
    "DIR.old-N (the first free N), never deleted and never mixed with the new one"
)


def run_files(path: str | Path) -> list[str]:
    """The names in ``path`` that show a run was written there (empty: no run)."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    return [name for name in RUN_FILES if (folder / name).exists()]


def aside_path(path: Path) -> Path:
    n = 1
    while Path(f"{path}.old-{n}").exists():
        n += 1
    return Path(f"{path}.old-{n}")


def claim_output_dir(
    path: str | Path,
    command: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    can_resume: bool = True,
    echo: Callable[[str], None] = print,
) -> None:
    """Make ``path`` ready for a new run of ``gspo <command>``, or refuse with one line.

    A resumed run continues the folder's own run (checked by the resume). A new run needs a
    folder without a run; ``overwrite`` moves an earlier run aside to ``path.old-N``.
    """
    if resume and overwrite:
        raise ConfigError(
            "--resume and --overwrite exclude each other: continue the run or replace it"
        )
    if resume:
        return
    found = run_files(path)
    if not found:
        return
    folder = Path(path)
    if not overwrite:
        offer = "continue it with --resume, or " if can_resume else ""
        raise ConfigError(
            f"{folder} already holds a run ({', '.join(found)}); {offer}pass --overwrite to move "
            f"it aside to {aside_path(folder)} and start a new one, or choose another --output-dir"
        )
    if folder.resolve() in (Path.cwd().resolve(), *Path.cwd().resolve().parents):
        raise ConfigError(
            f"--overwrite would move {folder} (the current folder) aside: choose another "
            "--output-dir"
        )
    aside = aside_path(folder)
    folder.rename(aside)
    echo(f"moved the earlier run in {folder} aside to {aside}")


def resume_command(command: str, output_dir: str | Path) -> str:
    """The exact command that continues the run in ``output_dir``."""
    return f"gspo {command} --output-dir {shlex.quote(str(output_dir))} --resume"


def stopped_line(
    command: str,
    output_dir: str | Path,
    step: int,
    checkpoint: Path | None,
    signum: int,
    phase: str = "",
) -> str:
    """The one line printed when a signal stopped a run after a step and its checkpoint."""
    name = signal.Signals(signum).name
    where = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint"
    return (
        f"gspo {command}: stopped by {name} after {phase}step {step}; {where}; resume with: "
        f"{resume_command(command, output_dir)}"
    )


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number."""
    return 128 + int(signum)


def interrupted(
    command: str,
    output_dir: str | Path,
    exc: KeyboardInterrupt,
    run_dirs: list[Path] | None = None,
    resumable: bool = False,
) -> int:
    """A second Ctrl-C (or one before the loop started): one line, no traceback.
    ``run_dirs``: the folders whose checkpoints resume the command (default: ``output_dir``);
    ``resumable``: a resume continues even without a checkpoint (a demo whose SFT is done)."""
    signum = getattr(exc, "signum", signal.SIGINT)
    found = None
    for folder in run_dirs or [Path(output_dir)]:
        found = found or latest_checkpoint(folder)
    if found is None and resumable:
        tail = f"resume with: {resume_command(command, output_dir)}"
    elif found is None:
        tail = "no checkpoint was written; start again with --overwrite (or another --output-dir)"
    else:
        tail = f"last checkpoint {found}; resume with: {resume_command(command, output_dir)}"
    print(f"gspo {command}: interrupted ({signal.Signals(signum).name}); {tail}", file=sys.stderr)
    return exit_code(signum)
