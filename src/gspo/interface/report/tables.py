"""Markdown tables of the report: one run's curve over blocks of steps (:func:`curve_table`),
the summary over seeds, the per-run numbers and the table paired by seed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gspo.core.comparison import compare_paired
from gspo.interface.report.stats import (
    COLUMNS,
    PAIRED_COLUMNS,
    Column,
    Summary,
    block_means,
    mean_se,
    paired_differences,
)


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


def fmt_number(x: float) -> str:
    """Three decimals, or three significant digits in scientific notation below 0.01."""
    if math.isnan(x):
        return "—"
    if x != 0 and abs(x) < 0.01:
        return f"{x:.2e}"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.3f}"


def fmt_mean_se(mean: float, se: float, n: int | None = None) -> str:
    """``mean ± se``. A mean smaller than its standard error is written at the standard error's
    precision (8.67e-19 ± 1e-3 -> 0.000 ± 0.001): its digits beyond that are noise, and
    scientific notation would make it look like a measured value. ``n`` 1 (one seed): the
    value and ``(n = 1)``, since one value has no standard error (not "± 0.000")."""
    if math.isnan(mean):
        return "—"
    if n == 1:
        return f"{fmt_number(mean)} (n = 1)"
    if math.isfinite(se) and se > 0 and abs(mean) < se:
        decimals = min(max(3, -math.floor(math.log10(se))), 12)
        shown = round(mean, decimals) + 0.0  # + 0.0: no "-0.000"
        return f"{shown:.{decimals}f} ± {se:.{decimals}f}"
    return f"{fmt_number(mean)} ± {fmt_number(se)}"


def summary_table(summary: Summary, columns: Sequence[Column] = COLUMNS) -> str:
    """Markdown: one row per group, mean ± standard error over seeds."""
    header = ["condition", "seeds", *(c.name for c in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, runs in summary.groups.items():
        cells = [f"`{label}`", str(len(runs))]
        for c in columns:
            mean, se, n = summary.stats(label, c.name)
            cells.append(fmt_mean_se(mean, se, n))
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
            mean, se, n = mean_se(diffs[c][label][0]) if seeds else (math.nan, math.nan, 0)
            cells.append(fmt_mean_se(mean, se, n))
        ratios = [
            v / ref_clip[r.seed]
            for r, v in zip(summary.groups[label], summary.values[label][clip], strict=True)
            if r.seed in ref_clip and ref_clip[r.seed] > 0 and not math.isnan(v)
        ]
        mean, se, n = mean_se(ratios) if seeds else (math.nan, math.nan, 0)
        cells.append(fmt_mean_se(mean, se, n))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


VERDICT_COLUMNS = (
    "held-out acc. (end)",
    "reward (end)",
    "reward (whole run)",
    "response length (start)",
    "response length (end)",
)
"""Columns the report states a verdict on (gspo.core.comparison): accuracy and reward, and the
response length early and late in the run (the length claims are about its trend)."""


def verdict_lines(summary: Summary, reference: str) -> list[str]:
    """One line per (condition, column) against ``reference``: the paired difference, its SE,
    95% bootstrap interval and MDE, and the verdict (a difference needs >= 10 seeds and an
    interval without 0; otherwise "cannot tell at this power")."""
    ref_runs = summary.groups[reference]
    others = [label for label in summary.groups if label != reference]
    lines = []
    for column in VERDICT_COLUMNS:
        for label in others:
            runs = summary.groups[label]
            problems = None
            if column.startswith("held-out"):
                problems = int(runs[0].config.get("n_test", 0)) or None
            c = compare_paired(
                {r.seed: v for r, v in zip(runs, summary.values[label][column], strict=True)},
                {
                    r.seed: v
                    for r, v in zip(ref_runs, summary.values[reference][column], strict=True)
                },
                names=(label, reference),
                problems=problems,
                shared_baseline=len(others),
            )
            if c.n:
                lines.append(f"- {column}: {c.line()}")
    return lines
