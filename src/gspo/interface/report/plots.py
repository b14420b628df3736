"""Plots of the report (matplotlib, imported when a plot is drawn): one run's reward and
response length (:func:`plot_run`), and a grid of panels comparing conditions, mean over seeds
with a ±1 standard-error band, against RL step or wall time (:func:`plot_comparison`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo.interface.report.data import Run, eval_records, eval_series, series, train_records
from gspo.interface.report.stats import block_means, mean_se, smooth
from gspo.orchestration.logging import read_metrics


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: str | Path, dpi: int) -> Path:
    """Lay out, write (making its folder) and close the figure."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


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
    return _save(plt, fig, path, dpi=110)


def plot_metrics_file(metrics_path: str | Path, out: str | Path) -> Path:
    return plot_run(read_metrics(metrics_path), out)


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


def symlog_threshold(means: Sequence[float]) -> float | None:
    """The linear range of a log panel's symlog axis: the power of ten at or below its smallest
    positive mean, so zeros (a step where nothing was clipped) are drawn at 0, and every positive
    value on the log part; None when nothing is positive (then the axis stays linear)."""
    positive = [v for v in means if not math.isnan(v) and v > 0]
    return 10.0 ** math.floor(math.log10(min(positive))) if positive else None


def smoothing_note(window: int) -> str:
    """How the training curves were smoothed, in words (no "average over 1 step")."""
    return f"moving average over {window} steps" if window > 1 else "per step, not smoothed"


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
    trailing moving average over max(1, steps // 25) steps before averaging over seeds (none
    under 50 steps). Log panels use a symlog axis, so zero values are drawn at 0.
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
        # Zeros have no place on a log axis, and drawing them at a made-up floor would show
        # values that were never logged: log panels use a symlog axis, linear near 0.
        threshold = symlog_threshold([v for c in curves for v in c[4]]) if panel.log else None
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
        if drawn and threshold is not None:
            ax.set_yscale("symlog", linthresh=threshold)
        elif drawn and panel.log:
            ax.text(0.5, 0.9, "all values 0", ha="center", transform=ax.transAxes, fontsize=8)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        if i == 0 and drawn:
            ax.legend(fontsize=7)
    for k in range(len(panels), n_rows * n_cols):
        axes[k // n_cols][k % n_cols].axis("off")
    sub = title or "mean over seeds, band = ±1 standard error"
    fig.suptitle(f"{sub}  (training curves: {smoothing_note(window)})", fontsize=10)
    return _save(plt, fig, path, dpi=100)
