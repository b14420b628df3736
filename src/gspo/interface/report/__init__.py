"""Plots and tables from runs' metrics.jsonl: one run (``plot_run``, ``curve_table``) or a
side-by-side comparison of many (``load_run``, ``group_runs``, ``build_report``).

A comparison groups runs by their settings: runs that differ only in ``seed`` (and in settings
that follow the seed, such as a per-seed cold-start checkpoint in ``model``: a path naming the
run's seed is compared with the seed taken out) are one group, the seeds of one condition; a
group's label is its ``algo`` plus any other setting that tells groups apart (see
:func:`condition_keys`: one extra run with other settings gets a group of its own). Log panels
use a symlog axis, so a zero is drawn at 0. Each group is drawn as the mean over seeds with a ±1 standard-error band, against RL step
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

Modules, by job: ``data`` (loading and grouping runs), ``stats`` (means, standard errors, the
summary columns), ``tables`` (Markdown), ``plots`` (matplotlib) and ``folder`` (the report
folder of :func:`build_report`).
"""

from gspo.interface.report.data import (
    IGNORED_KEYS,
    TIME_KEYS,
    Run,
    condition_keys,
    discover_runs,
    eval_records,
    eval_series,
    group_runs,
    load_run,
    read_config,
    series,
    train_records,
)
from gspo.interface.report.folder import (
    SETTINGS_SHOWN,
    Report,
    build_report,
)
from gspo.interface.report.plots import (
    LINESTYLES,
    MARKERS,
    PANELS,
    Panel,
    line_style,
    plot_comparison,
    plot_metrics_file,
    plot_run,
    smoothing_note,
    symlog_threshold,
)
from gspo.interface.report.stats import (
    COLUMNS,
    PAIRED_COLUMNS,
    Column,
    Summary,
    block_means,
    mean_se,
    paired_differences,
    run_scalar,
    smooth,
    summarize,
    tail_mean,
)
from gspo.interface.report.tables import (
    curve_table,
    fmt_mean_se,
    fmt_number,
    paired_table,
    per_run_table,
    summary_table,
)

__all__ = [
    "COLUMNS",
    "IGNORED_KEYS",
    "LINESTYLES",
    "MARKERS",
    "PAIRED_COLUMNS",
    "PANELS",
    "SETTINGS_SHOWN",
    "TIME_KEYS",
    "Column",
    "Panel",
    "Report",
    "Run",
    "Summary",
    "block_means",
    "build_report",
    "condition_keys",
    "curve_table",
    "discover_runs",
    "eval_records",
    "eval_series",
    "fmt_mean_se",
    "fmt_number",
    "group_runs",
    "line_style",
    "load_run",
    "mean_se",
    "paired_differences",
    "paired_table",
    "per_run_table",
    "plot_comparison",
    "plot_metrics_file",
    "plot_run",
    "read_config",
    "run_scalar",
    "series",
    "smooth",
    "smoothing_note",
    "summarize",
    "summary_table",
    "symlog_threshold",
    "tail_mean",
    "train_records",
]
