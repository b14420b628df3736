"""Statistics of the report: block and moving means, end-of-training means, mean ± standard
error over seeds, the per-run scalars of the summary columns (:func:`summarize`) and per-seed
differences to a reference condition (:func:`paired_differences`)."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gspo.interface.report.data import Run, eval_series, series, train_records


def block_means(
    history: list[dict[str, Any]], key: str, blocks: int = 8
) -> list[tuple[int, int, float]]:
    """(first step, last step, mean of ``key``) over ``blocks`` equal blocks of training steps."""
    rows = [r for r in train_records(history) if key in r]
    if not rows:
        return []
    size = max(len(rows) // blocks, 1)
    out = []
    for i in range(0, len(rows), size):
        chunk = rows[i : i + size]
        out.append((chunk[0]["step"], chunk[-1]["step"], sum(r[key] for r in chunk) / len(chunk)))
    return out


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def tail_mean(values: Sequence[float], tail: float) -> float:
    """Mean of the last ``tail`` share of ``values`` (at least one value), NaNs skipped."""
    if not values:
        return math.nan
    n = max(1, math.ceil(len(values) * tail))
    return _nanmean(values[-n:])


def mean_se(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, standard error, n) over the finite values: sample std / sqrt(n); se 0 for n = 1."""
    finite = [v for v in values if not math.isnan(v)]
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, 0
    mean = statistics.fmean(finite)
    if n == 1:
        return mean, 0.0, 1
    return mean, statistics.stdev(finite) / math.sqrt(n), n  # stdev: exact, 0 for equal values


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (NaNs skipped)."""
    out = []
    for i in range(len(values)):
        out.append(_nanmean(values[max(0, i - window + 1) : i + 1]))
    return out


@dataclass(frozen=True)
class Column:
    """One summary-table column: a per-run scalar."""

    name: str
    key: str
    how: str
    """'tail' (end-of-training mean), 'head' (the same over the first steps), 'all' (whole-run
    mean), 'last_eval', 'first_eval', 'final' (the last value, e.g. of time/elapsed_s)."""


COLUMNS: tuple[Column, ...] = (
    Column("held-out acc. (start)", "eval/greedy_accuracy", "first_eval"),
    Column("held-out acc. (end)", "eval/greedy_accuracy", "last_eval"),
    Column("reward (end)", "reward/mean", "tail"),
    Column("reward (whole run)", "reward/mean", "all"),
    Column("response length (start)", "response_length/mean", "head"),
    Column("response length (end)", "response_length/mean", "tail"),
    Column("clip fraction (end)", "clip/fraction", "tail"),
    Column("clip fraction (whole run)", "clip/fraction", "all"),
    Column("clip seq. fraction (whole run)", "clip/seq_fraction", "all"),
    Column("ratio spread (end)", "ratio/spread", "tail"),
    Column("KL old/new (end)", "kl/old_new", "tail"),
    Column("wall time s", "time/elapsed_s", "final"),
)


SUCCESS_COLUMNS: tuple[Column, ...] = (
    Column("held-out success (start)", "eval/success", "first_eval"),
    Column("held-out success (end)", "eval/success", "last_eval"),
)
"""Runs of a multi-turn environment: the share of held-out episodes the environment reported
solved (greedy accuracy there is final reward >= 1, e.g. a first-guess win)."""


def columns_for(groups: dict[str, list[Run]]) -> tuple[Column, ...]:
    """The summary columns of these runs: :data:`COLUMNS`, with the held-out success beside the
    held-out accuracy when a run's evaluations report it (multi-turn environments)."""
    if any("eval/success" in r for runs in groups.values() for run in runs for r in run.records):
        return (*COLUMNS[:2], *SUCCESS_COLUMNS, *COLUMNS[2:])
    return COLUMNS


def run_scalar(run: Run, column: Column, tail: float) -> float:
    """The value of ``column`` for one run (NaN when the run lacks the metric)."""
    if column.how in ("first_eval", "last_eval"):
        _, values = eval_series(run, column.key)
        if not values:
            return math.nan
        return values[0] if column.how == "first_eval" else values[-1]
    _, values = series(run, column.key)
    if column.how == "tail":
        return tail_mean(values, tail)
    if column.how == "head":
        return tail_mean(values[::-1], tail)
    if column.how == "all":
        return _nanmean(values)
    if column.how == "final":
        return values[-1] if values else math.nan
    raise ValueError(f"unknown column kind {column.how!r}")


@dataclass
class Summary:
    """Mean, standard error and per-seed values of every column for every group."""

    groups: dict[str, list[Run]]
    tail: float
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """values[label][column name] = per-run values in seed order."""

    def stats(self, label: str, column: str) -> tuple[float, float, int]:
        return mean_se(self.values[label][column])

    def to_json(self, folder: str | Path | None = None) -> dict[str, Any]:
        """The summary as JSON data; run paths relative to ``folder`` (the report's own), so
        a report moved or committed names no folder of the machine that made it."""
        out: dict[str, Any] = {"tail": self.tail, "groups": {}}
        for label, runs in self.groups.items():
            cols = {}
            for name, vals in self.values[label].items():
                mean, se, n = mean_se(vals)
                cols[name] = {
                    "mean": _json_float(mean),
                    "se": _json_float(se),
                    "n": n,
                    "per_seed": [_json_float(v) for v in vals],
                }
            out["groups"][label] = {
                "algo": runs[0].algo,
                "seeds": [r.seed for r in runs],
                "runs": [_path_from(r.path, folder) for r in runs],
                "steps": [len(r.train) for r in runs],
                "columns": cols,
            }
        return out


def _path_from(path: Path, folder: str | Path | None) -> str:
    return (
        str(path)
        if folder is None
        else os.path.relpath(Path(path).resolve(), Path(folder).resolve())
    )


def _json_float(x: float) -> float | None:
    return None if math.isnan(x) else x


def summarize(
    groups: dict[str, list[Run]], *, tail: float = 0.1, columns: Sequence[Column] = COLUMNS
) -> Summary:
    """Per-run scalars of every column, grouped."""
    if not 0 < tail <= 1:
        raise ValueError(f"tail must be in (0, 1], got {tail}")
    summary = Summary(groups=groups, tail=tail)
    for label, runs in groups.items():
        summary.values[label] = {c.name: [run_scalar(r, c, tail) for r in runs] for c in columns}
    return summary


PAIRED_COLUMNS = (
    "held-out acc. (end)",
    "reward (end)",
    "reward (whole run)",
    "response length (end)",
    "clip fraction (whole run)",
)
"""Columns whose per-seed differences to the reference condition the paired table shows."""


def paired_differences(
    summary: Summary, reference: str, column: str
) -> dict[str, tuple[list[float], list[int]]]:
    """Per-seed ``group - reference`` differences of ``column`` over the seeds both ran, for
    every other group: {label: (differences, seeds)}. Runs of one seed share the cold start and
    data order, so pairing removes the (often large) variation between seeds."""
    ref_runs = summary.groups[reference]
    ref = {r.seed: v for r, v in zip(ref_runs, summary.values[reference][column], strict=True)}
    out: dict[str, tuple[list[float], list[int]]] = {}
    for label, runs in summary.groups.items():
        if label == reference:
            continue
        diffs, seeds = [], []
        for run, value in zip(runs, summary.values[label][column], strict=True):
            if run.seed in ref and not math.isnan(value) and not math.isnan(ref[run.seed]):
                diffs.append(value - ref[run.seed])
                seeds.append(run.seed)
        out[label] = (diffs, seeds)
    return out
