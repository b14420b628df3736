"""Plots and tables from runs' metrics.jsonl: one run (``plot_run``, ``curve_table``) or a
side-by-side comparison of many (``load_run``, ``group_runs``, ``build_report``).

A comparison groups runs by their settings: runs that differ only in ``seed`` (and in settings
that follow the seed, such as a per-seed cold-start checkpoint in ``model``) are one group, the
seeds of one condition; a group's label is its ``algo`` plus any other setting that tells groups
apart. Each group is drawn as the mean over seeds with a ±1 standard-error band, against RL step
and against training wall time; the summary table gives mean ± standard error over seeds of
end-of-training values.

Definitions used by the report (also printed in its summary):

- *end of training*: the mean of a metric over the last ``tail`` share of training steps
  (at least one step) of each run; held-out accuracy is the last evaluation's.
- *whole run*: the mean over all training steps (for reward: the area under the curve divided
  by the number of steps, a sample-efficiency figure).
- *wall time*: the cumulative sum of ``time/rollout_s + time/recompute_s + time/train_s`` (held-out
  evaluation excluded).
- *ratio spread*: ``ratio/max - ratio/min`` of a step (sequence ratios for the GSPO family,
  token ratios for GRPO).
- standard error: sample standard deviation over seeds / sqrt(number of seeds); 0 for one seed.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .logging import read_metrics

# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


def train_records(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "reward/mean" in r]


def eval_records(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "eval/greedy_accuracy" in r]


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


def curve_table(history: list[dict[str, Any]], blocks: int = 8) -> str:
    """A Markdown table of reward, response length and clip fraction over blocks of steps."""
    keys = ("reward/mean", "response_length/mean", "clip/fraction")
    cols = {k: block_means(history, k, blocks) for k in keys}
    lines = ["| steps | reward | response length | clip fraction |", "|---|---|---|---|"]
    for i, (a, b, r) in enumerate(cols["reward/mean"]):
        length = cols["response_length/mean"][i][2]
        clip = cols["clip/fraction"][i][2] if i < len(cols["clip/fraction"]) else float("nan")
        lines.append(f"| {a}-{b} | {r:.3f} | {length:.2f} | {clip:.3f} |")
    return "\n".join(lines)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(history: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """PNG with reward, held-out accuracy and response length against step."""
    plt = _pyplot()
    train = train_records(history)
    evals = eval_records(history)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = [r["step"] for r in train]
    axes[0].plot(
        steps, [r["reward/mean"] for r in train], alpha=0.35, label="train reward (per step)"
    )
    smooth = block_means(history, "reward/mean", blocks=max(len(train) // 10, 1))
    axes[0].plot(
        [(a + b) / 2 for a, b, _ in smooth],
        [m for *_, m in smooth],
        label="train reward (block mean)",
    )
    if evals:
        axes[0].plot(
            [r["step"] for r in evals],
            [r["eval/greedy_accuracy"] for r in evals],
            "o-",
            label="held-out greedy accuracy",
        )
    axes[0].set_xlabel("RL step")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    axes[0].set_title("reward")
    axes[1].plot(steps, [r["response_length/mean"] for r in train], label="mean response length")
    axes[1].set_xlabel("RL step")
    axes[1].set_ylabel("tokens")
    axes[1].set_title("response length")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_metrics_file(metrics_path: str | Path, out: str | Path) -> Path:
    return plot_run(read_metrics(metrics_path), out)


# --------------------------------------------------------------------------------------------
# Many runs: loading and grouping
# --------------------------------------------------------------------------------------------

IGNORED_KEYS = frozenset(
    {
        "output_dir",
        "seed",
        "progress",
        "threads",
        "device",
        "tensorboard",
        "wandb",
        "stop_after",
        "checkpoint_every",
        "keep_checkpoints",
    }
)
"""Config keys that never tell two conditions apart (where a run lives, how it was watched)."""

TIME_KEYS = ("time/rollout_s", "time/recompute_s", "time/train_s")


@dataclass
class Run:
    """One finished (or partial) run: its folder, saved config and metric records."""

    path: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]
    label: str = ""
    """The group label, set by :func:`group_runs`."""

    @property
    def algo(self) -> str:
        return str(self.config.get("algo", "?"))

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def train(self) -> list[dict[str, Any]]:
        """Training-step records in step order (the last record wins for a repeated step)."""
        by_step = {r["step"]: r for r in train_records(self.records)}
        return [by_step[s] for s in sorted(by_step)]

    @property
    def evals(self) -> list[dict[str, Any]]:
        by_step = {r["step"]: r for r in eval_records(self.records)}
        return [by_step[s] for s in sorted(by_step)]


def _number(value: Any) -> float:
    """A metric value as a float; JSONL stores inf/NaN as strings, missing values are NaN."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return float(value)


def read_config(run_dir: str | Path) -> dict[str, Any]:
    """The config a run was made with: ``config.json`` at its root (written by the trainer at
    start), else the ``config`` of its newest ``checkpoints/*/state.json``."""
    run_dir = Path(run_dir)
    top = run_dir / "config.json"
    if top.is_file():
        data = json.loads(top.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{top}: expected a JSON object of config fields")
        return data
    states = sorted((run_dir / "checkpoints").glob("*/state.json"))
    if states:
        state = json.loads(states[-1].read_text())
        if isinstance(state, dict) and isinstance(state.get("config"), dict):
            return state["config"]
    raise ValueError(
        f"{run_dir}: no run config found (looked for config.json and checkpoints/*/state.json); "
        "runs made by `gspo train` or `gspo compare` have one"
    )


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder's ``metrics.jsonl`` and saved config."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is this a run folder?)")
    try:
        records = read_metrics(metrics)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{metrics}: line {exc.lineno} is not JSON: {exc.msg}") from None
    run = Run(path=run_dir, config=read_config(run_dir), records=records)
    if not run.train:
        raise ValueError(f"{metrics}: no training-step records (reward/mean)")
    return run


def discover_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders named by ``paths``: each path is a run folder (holding metrics.jsonl) or a
    folder searched recursively for run folders (e.g. the output of ``gspo compare``)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such run folder")
        if (p / "metrics.jsonl").is_file():
            found.append(p)
            continue
        below = sorted(m.parent for m in p.rglob("metrics.jsonl"))
        if not below:
            raise FileNotFoundError(f"{p}: no metrics.jsonl in it or below it")
        found += below
    unique: dict[Path, None] = {}
    for p in found:
        unique.setdefault(p.resolve(), None)
    return list(unique)


def _fmt_value(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def condition_keys(runs: Sequence[Run], ignore: Iterable[str] = ()) -> list[str]:
    """Config keys (besides algo) that tell conditions apart: keys whose values differ between
    runs of the same seed (among the runs that saved the key). Keys that only follow the seed (a
    per-seed cold-start ``model``), :data:`IGNORED_KEYS` and ``ignore`` are not conditions."""
    keys: set[str] = set()
    by_seed: dict[int, list[Run]] = {}
    for run in runs:
        by_seed.setdefault(run.seed, []).append(run)
    skip = IGNORED_KEYS | set(ignore) | {"algo"}
    all_keys = sorted({k for run in runs for k in run.config} - skip)
    for key in all_keys:
        for group in by_seed.values():
            # A key missing from a run's config (saved by an older version) is unknown there,
            # not different: only runs that saved it are compared.
            values = {json.dumps(r.config[key], sort_keys=True) for r in group if key in r.config}
            if len(values) > 1:
                keys.add(key)
                break
    return sorted(keys)


def group_runs(runs: Sequence[Run], ignore: Iterable[str] = ()) -> dict[str, list[Run]]:
    """Runs grouped by condition, in first-seen order; each group sorted by seed.

    ``ignore`` names config keys that must not split groups (for example ``model`` when the
    same cold start was made twice in different folders). Raises ValueError when two runs of one
    condition share a seed (one would hide the other).
    """
    if not runs:
        raise ValueError("no runs to group")
    keys = condition_keys(runs, ignore)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        parts = [run.algo] + [f"{k}={_fmt_value(run.config.get(k))}" for k in keys]
        run.label = " ".join(parts)
        groups.setdefault(run.label, []).append(run)
    for label, members in groups.items():
        members.sort(key=lambda r: r.seed)
        seeds = [r.seed for r in members]
        for seed in set(seeds):
            if seeds.count(seed) > 1:
                dupes = ", ".join(str(r.path) for r in members if r.seed == seed)
                raise ValueError(f"runs {dupes} are both {label!r} with seed {seed}")
    return groups


# --------------------------------------------------------------------------------------------
# Per-run series and scalars
# --------------------------------------------------------------------------------------------


def series(run: Run, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a training metric; derived keys: ``ratio/spread``, ``time/elapsed_s``."""
    train = run.train
    steps = [int(r["step"]) for r in train]
    if key == "ratio/spread":
        values = [_number(r.get("ratio/max")) - _number(r.get("ratio/min")) for r in train]
    elif key == "time/elapsed_s":
        values, total = [], 0.0
        for r in train:
            total += sum(_number(r.get(k, 0.0)) for k in TIME_KEYS)
            values.append(total)
    else:
        values = [_number(r.get(key)) for r in train]
    return steps, values


def eval_series(run: Run, key: str = "eval/greedy_accuracy") -> tuple[list[int], list[float]]:
    evals = run.evals
    return [int(r["step"]) for r in evals], [_number(r.get(key)) for r in evals]


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


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def fmt_number(x: float) -> str:
    """Three decimals, or three significant digits in scientific notation below 0.01."""
    if math.isnan(x):
        return "—"
    if x != 0 and abs(x) < 0.01:
        return f"{x:.2e}"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.3f}"


def fmt_mean_se(mean: float, se: float) -> str:
    if math.isnan(mean):
        return "—"
    return f"{fmt_number(mean)} ± {fmt_number(se)}"


@dataclass
class Summary:
    """Mean, standard error and per-seed values of every column for every group."""

    groups: dict[str, list[Run]]
    tail: float
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """values[label][column name] = per-run values in seed order."""

    def stats(self, label: str, column: str) -> tuple[float, float, int]:
        return mean_se(self.values[label][column])

    def to_json(self) -> dict[str, Any]:
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
                "runs": [str(r.path) for r in runs],
                "steps": [len(r.train) for r in runs],
                "columns": cols,
            }
        return out


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


def summary_table(summary: Summary, columns: Sequence[Column] = COLUMNS) -> str:
    """Markdown: one row per group, mean ± standard error over seeds."""
    header = ["condition", "seeds", *(c.name for c in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, runs in summary.groups.items():
        cells = [f"`{label}`", str(len(runs))]
        for c in columns:
            mean, se, _ = summary.stats(label, c.name)
            cells.append(fmt_mean_se(mean, se))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_run_table(summary: Summary, columns: Sequence[Column] = COLUMNS) -> str:
    """Markdown: one row per run (the numbers behind the means)."""
    header = ["condition", "seed", "steps", *(c.name for c in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, runs in summary.groups.items():
        for i, run in enumerate(runs):
            cells = [f"`{label}`", str(run.seed), str(len(run.train))]
            cells += [fmt_number(summary.values[label][c.name][i]) for c in columns]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def paired_table(
    summary: Summary, reference: str | None = None, columns: Sequence[str] = PAIRED_COLUMNS
) -> str:
    """Markdown: mean ± standard error over shared seeds of each group's per-seed difference to
    ``reference`` (default: the first group), plus the per-seed ratio of clip fractions."""
    labels = list(summary.groups)
    reference = labels[0] if reference is None else reference
    if reference not in summary.groups:
        raise ValueError(f"unknown reference condition {reference!r}; have {', '.join(labels)}")
    if len(labels) < 2:
        return "(one condition: nothing to pair)"
    clip = "clip fraction (whole run)"
    header = ["condition", "paired seeds", *(f"Δ {c}" for c in columns), f"ratio {clip}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    diffs = {c: paired_differences(summary, reference, c) for c in columns}
    ref_clip = {
        r.seed: v
        for r, v in zip(summary.groups[reference], summary.values[reference][clip], strict=True)
    }
    for label in labels:
        if label == reference:
            continue
        # The seeds both conditions ran; a column a run did not log (e.g. held-out accuracy
        # with evaluation off) shows "—" rather than hiding the pairing of the others.
        seeds = sorted({r.seed for r in summary.groups[label]} & set(ref_clip))
        cells = [f"`{label}`", ", ".join(map(str, seeds)) or "none"]
        for c in columns:
            mean, se, _ = mean_se(diffs[c][label][0]) if seeds else (math.nan, math.nan, 0)
            cells.append(fmt_mean_se(mean, se))
        ratios = [
            v / ref_clip[r.seed]
            for r, v in zip(summary.groups[label], summary.values[label][clip], strict=True)
            if r.seed in ref_clip and ref_clip[r.seed] > 0 and not math.isnan(v)
        ]
        mean, se, _ = mean_se(ratios) if seeds else (math.nan, math.nan, 0)
        cells.append(fmt_mean_se(mean, se))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    title: str
    key: str
    log: bool = False
    eval: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("train reward", "reward/mean"),
    Panel("held-out greedy accuracy", "eval/greedy_accuracy", eval=True),
    Panel("response length (tokens)", "response_length/mean"),
    Panel("clipped-token fraction", "clip/fraction", log=True),
    Panel("ratio spread (max - min)", "ratio/spread", log=True),
    Panel("KL(old || new)", "kl/old_new", log=True),
)


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (NaNs skipped)."""
    out = []
    for i in range(len(values)):
        out.append(_nanmean(values[max(0, i - window + 1) : i + 1]))
    return out


def _aligned(
    runs: Sequence[Run], key: str, is_eval: bool, window: int
) -> tuple[list[int], list[list[float]], list[list[float]]]:
    """Common steps of the group's runs, per-run values and per-run elapsed time at those steps."""
    per_run: list[dict[int, tuple[float, float]]] = []
    for run in runs:
        steps, elapsed = series(run, "time/elapsed_s")
        clock = dict(zip(steps, elapsed, strict=True))
        clock[0] = 0.0
        if is_eval:
            s, v = eval_series(run, key)
        else:
            s, v = series(run, key)
            v = smooth(v, window)
        per_run.append({st: (val, clock.get(st, math.nan)) for st, val in zip(s, v, strict=True)})
    common = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    values = [[d[s][0] for s in common] for d in per_run]
    clocks = [[d[s][1] for s in common] for d in per_run]
    return common, values, clocks


def _band(values: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    means, lows, highs = [], [], []
    for column in zip(*values, strict=True):
        m, se, _ = mean_se(column)
        means.append(m)
        lows.append(m - se)
        highs.append(m + se)
    return means, lows, highs


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x")


def line_style(index: int) -> tuple[str, str]:
    """(line style, marker) of the ``index``-th group: distinct pairs for the first 12 groups,
    so a line drawn over another of equal values still shows (dashes, markers)."""
    return LINESTYLES[index % len(LINESTYLES)], MARKERS[index % len(MARKERS)]


def log_floor(means: Sequence[float]) -> float | None:
    """Where a log panel draws zeros: half its smallest positive mean; None when nothing is
    positive (then the panel keeps a linear axis, and zeros sit at 0)."""
    positive = [v for v in means if not math.isnan(v) and v > 0]
    return min(positive) / 2 if positive else None


def plot_comparison(
    groups: dict[str, list[Run]],
    path: str | Path,
    *,
    x: str = "step",
    panels: Sequence[Panel] = PANELS,
    title: str = "",
) -> Path:
    """A grid of panels, one line (mean over seeds) and ±1 SE band per group.

    ``x`` is "step" (RL steps) or "time" (training wall time in seconds: at each step, the mean
    over the group's seeds of their cumulative step time). Training metrics are smoothed by a
    trailing moving average over max(1, steps // 25) steps before averaging over seeds.
    """
    if x not in ("step", "time"):
        raise ValueError(f"x must be 'step' or 'time', got {x!r}")
    plt = _pyplot()
    n_cols = 3
    n_rows = math.ceil(len(panels) / n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(5.2 * n_cols, 3.6 * n_rows), squeeze=False)
    longest = max(len(r.train) for runs in groups.values() for r in runs)
    window = max(1, longest // 25)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, panel in enumerate(panels):
        ax = axes[i // n_cols][i % n_cols]
        curves = []
        for j, (label, runs) in enumerate(groups.items()):
            steps, values, clocks = _aligned(runs, panel.key, panel.eval, window)
            if not steps or all(math.isnan(v) for row in values for v in row):
                continue
            mean, low, high = _band(values)
            xs = steps if x == "step" else _band(clocks)[0]
            curves.append((j, label, len(runs), xs, mean, low, high))
        floor = log_floor([v for c in curves for v in c[4]]) if panel.log else None
        if floor is not None:
            # Zeros (a step where nothing was clipped) have no place on a log axis: show them,
            # and band edges below them, at half the smallest positive mean of the panel.
            curves = [
                (
                    j,
                    label,
                    n,
                    xs,
                    *([v if math.isnan(v) else max(v, floor) for v in seq] for seq in (m, lo, hi)),
                )
                for j, label, n, xs, m, lo, hi in curves
            ]
        for j, label, n, xs, mean, low, high in curves:
            color = colors[j % len(colors)]
            linestyle, marker = line_style(j)
            ax.plot(
                xs,
                mean,
                linestyle=linestyle,
                marker=marker,
                markevery=None if panel.eval else max(1, len(xs) // 12),
                color=color,
                label=f"{label} (n={n})",
                ms=4,
                alpha=0.9,
            )
            if n > 1:
                ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)
        drawn = bool(curves)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("RL step" if x == "step" else "training wall time (s)")
        if drawn and floor is not None:
            ax.set_yscale("log")
        elif drawn and panel.log:
            ax.text(0.5, 0.9, "all values 0", ha="center", transform=ax.transAxes, fontsize=8)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        if i == 0 and drawn:
            ax.legend(fontsize=7)
    for k in range(len(panels), n_rows * n_cols):
        axes[k // n_cols][k % n_cols].axis("off")
    sub = title or "mean over seeds, band = ±1 standard error"
    fig.suptitle(f"{sub}  (training curves: moving average over {window} steps)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------
# The report folder
# --------------------------------------------------------------------------------------------

SETTINGS_SHOWN = (
    "task",
    "difficulty",
    "model",
    "steps",
    "prompts_per_step",
    "group_size",
    "max_new_tokens",
    "num_minibatches",
    "minibatch_grouping",
    "lr",
    "temperature",
    "clip_low",
    "clip_high",
    "aggregation",
    "advantage_scale",
    "kl_coef",
    "old_logprobs",
)


@dataclass
class Report:
    output_dir: Path
    summary: Summary
    markdown: Path
    plots: list[Path]
    raw: list[Path]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "run"


def _settings_lines(groups: dict[str, list[Run]]) -> list[str]:
    lines = []
    present = {k for runs in groups.values() for r in runs for k in r.config}
    for key in SETTINGS_SHOWN:
        if key not in present:
            continue
        per_group = {}
        for label, runs in groups.items():
            vals = sorted({json.dumps(r.config.get(key)) for r in runs})
            per_group[label] = ", ".join(vals)
        distinct = set(per_group.values())
        if len(distinct) == 1:
            lines.append(f"- `{key}`: {distinct.pop()}")
        else:
            lines.append(
                f"- `{key}`: " + "; ".join(f"{label}: {v}" for label, v in per_group.items())
            )
    return lines


def build_report(
    run_dirs: Sequence[str | Path],
    output_dir: str | Path,
    *,
    tail: float = 0.1,
    title: str = "",
    reference: str | None = None,
    ignore: Sequence[str] = (),
) -> Report:
    """Write the comparison report of ``run_dirs`` into ``output_dir``.

    Writes ``curves_vs_step.png``, ``curves_vs_time.png``, ``summary.md`` (settings, the
    mean ± standard-error table, the per-run table, the definitions), ``summary.json`` (the same
    numbers at full precision) and ``raw/<condition>_seed<k>.jsonl`` with
    ``raw/<condition>_seed<k>.config.json`` (each run's metrics and config, copied).
    ``reference`` names the condition the paired table compares against (default: the first);
    ``ignore`` lists config keys that do not split conditions (see :func:`group_runs`).
    """
    paths = discover_runs(run_dirs)
    runs = [load_run(p) for p in paths]
    groups = group_runs(runs, ignore)
    summary = summarize(groups, tail=tail)
    reference = next(iter(groups)) if reference is None else reference
    if reference not in groups:
        raise ValueError(f"unknown reference condition {reference!r}; have {', '.join(groups)}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)

    plots = [
        plot_comparison(groups, out / "curves_vs_step.png", x="step", title=title),
        plot_comparison(groups, out / "curves_vs_time.png", x="time", title=title),
    ]
    raw_dir = out / "raw"
    if raw_dir.exists():
        shutil.rmtree(raw_dir)
    raw_dir.mkdir()
    raw: list[Path] = []
    for label, members in groups.items():
        for run in members:
            name = f"{_safe_name(label)}_seed{run.seed}"
            shutil.copyfile(run.path / "metrics.jsonl", raw_dir / f"{name}.jsonl")
            (raw_dir / f"{name}.config.json").write_text(json.dumps(run.config, indent=2))
            raw.append(raw_dir / f"{name}.jsonl")

    (out / "summary.json").write_text(json.dumps(summary.to_json(), indent=2))
    tail_pct = f"{tail:.0%}"
    md = [
        f"# {title or 'Run comparison'}",
        "",
        f"{len(runs)} runs in {len(groups)} conditions: "
        + ", ".join(
            f"`{label}` (seeds {', '.join(str(r.seed) for r in m)})" for label, m in groups.items()
        )
        + ".",
        "",
        "## Settings",
        "",
        *_settings_lines(groups),
        "",
        f"## End of training (mean ± standard error over seeds; 'end' = last {tail_pct} of steps)",
        "",
        summary_table(summary),
        "",
        f"## Paired by seed, against `{reference}`",
        "",
        "Runs of one seed share the cold start, data order and sampling streams; Δ is the "
        "mean ± standard error over seeds of (condition − reference) per seed, and the ratio "
        "is the per-seed clip fraction divided by the reference's.",
        "",
        paired_table(summary, reference),
        "",
        "## Per run",
        "",
        per_run_table(summary),
        "",
        "## Curves",
        "",
        "![against RL step](curves_vs_step.png)",
        "",
        "![against training wall time](curves_vs_time.png)",
        "",
        "## Definitions",
        "",
        f"- *(end)*: mean over the last {tail_pct} of a run's training steps (at least one), "
        f"*(start)* over the first {tail_pct}; held-out accuracy *(end)* is the last evaluation, "
        "*(start)* the first (step 0, before RL).",
        "- *(whole run)*: mean over all training steps; for reward this is the area under the "
        "curve per step, a sample-efficiency figure.",
        "- clip fraction: share of response tokens whose gradient clipping zeroed (a clipped GSPO "
        "sequence clips all its tokens); clip seq. fraction: share of sequences with any clipped token.",
        "- ratio spread: ratio/max − ratio/min of a step (sequence ratios for the GSPO family, "
        "token ratios for GRPO), over all minibatches.",
        "- wall time: cumulative rollout + recompute + train time, evaluation excluded; runs on a "
        "shared machine make it noisy.",
        "- ± is the standard error over seeds: sample std / sqrt(seeds) (0 for one seed).",
        "- Raw metrics and configs of every run: `raw/`; full-precision numbers: `summary.json`.",
        "",
    ]
    markdown = out / "summary.md"
    markdown.write_text("\n".join(md))
    return Report(output_dir=out, summary=summary, markdown=markdown, plots=plots, raw=raw)
