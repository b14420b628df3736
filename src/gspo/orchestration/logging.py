"""Metric sinks: a JSONL file (always), a progress bar, and optional TensorBoard / wandb."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .phases import active_view

PROGRESS_KEYS = (
    ("reward/mean", "reward"),
    ("response_length/mean", "len"),
    ("clip/fraction", "clip"),
    ("eval/greedy_accuracy", "acc"),
)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/NaN; keep them visible as strings
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


class MetricsLogger:
    """Appends one JSON object per record to ``metrics.jsonl``; mirrors to optional sinks."""

    def __init__(
        self,
        output_dir: str | Path,
        *,
        resume_step: int = 0,
        tensorboard: bool = False,
        wandb: bool = False,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step > 0 and self.path.exists():
            # Records written after the checkpoint we resume from are replayed by the new run.
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        elif resume_step == 0:
            self.path.write_text("")
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise RuntimeError("tensorboard=True needs `pip install tensorboard`") from exc
            self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as exc:
                raise RuntimeError("wandb=True needs `pip install wandb`") from exc
            self._wandb = wandb_module.init(
                project="gspo", dir=str(output_dir), config=config or {}
            )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        numeric = {
            k: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def progress_postfix(metrics: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, short in PROGRESS_KEYS:
        if key in metrics and isinstance(metrics[key], (int, float)):
            out[short] = f"{metrics[key]:.3g}"
    return out


def eta_s(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left at the phase's average rate so far: elapsed / done x (total - done).

    The average over the whole phase, not tqdm's default moving average of the last steps: a
    training phase alternates fast steps with slow ones (held-out evaluation every eval_every
    steps, checkpoints), and the moving average forgets the slow ones between them. In the bar
    log of one ``gspo demo --threads 1`` run (busy 2-core machine) tqdm's moving average was off
    by 34% of the true time left (median; up to 140%) in the RL phase; this average, computed
    from the same log, by 14% (up to 49%)."""
    if done <= 0:
        return None
    return elapsed_s / done * max(total - done, 0)


def progress_bar(total: int, desc: str, unit: str = "step", **kwargs: Any):
    """A tqdm bar whose ETA is :func:`eta_s` (smoothing=0 is tqdm's average-rate mode); inside a
    :class:`~gspo.orchestration.phases.PhasedBar` phase, that one bar's view instead (its ETA
    counts the later phases too)."""
    view = active_view(total, kwargs.get("initial", 0))
    if view is not None:
        return view
    average_rate = 0  # tqdm's smoothing: 0 = the average since the start (eta_s)
    return tqdm(
        total=total, desc=desc, unit=unit, dynamic_ncols=True, smoothing=average_rate, **kwargs
    )
