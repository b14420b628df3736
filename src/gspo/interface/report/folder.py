"""The report folder of a comparison (:func:`build_report`): plots, ``summary.md``,
``summary.json`` and each run's raw metrics and config."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gspo.interface.report.data import Run, discover_runs, group_runs, load_run
from gspo.interface.report.plots import plot_comparison
from gspo.interface.report.stats import Summary, columns_for, summarize
from gspo.interface.report.tables import (
    paired_table,
    per_run_table,
    summary_table,
    verdict_lines,
)

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
    columns = columns_for(groups)
    summary = summarize(groups, tail=tail, columns=columns)
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

    (out / "summary.json").write_text(json.dumps(summary.to_json(out), indent=2))
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
        summary_table(summary, columns),
        "",
        f"## Paired by seed, against `{reference}`",
        "",
        "Runs of one seed share the cold start, data order and sampling streams; Δ is the "
        "mean ± standard error over seeds of (condition − reference) per seed, and the ratio "
        "is the per-seed clip fraction divided by the reference's.",
        "",
        paired_table(summary, reference),
        "",
        'Verdicts (DESIGN.md, "How learning is compared"): the paired difference with its '
        "standard error, 95% bootstrap interval over seeds and minimum detectable effect (MDE); "
        "a difference is called one only with >= 10 seeds and an interval that excludes 0.",
        "",
        *verdict_lines(summary, reference),
        "",
        "## Per run",
        "",
        per_run_table(summary, columns),
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
        "- ± is the standard error over seeds: sample std / sqrt(seeds); one seed shows its value and (n = 1).",
        "- Raw metrics and configs of every run: `raw/`; full-precision numbers: `summary.json`.",
        "",
    ]
    markdown = out / "summary.md"
    markdown.write_text("\n".join(md))
    return Report(output_dir=out, summary=summary, markdown=markdown, plots=plots, raw=raw)
