"""``gspo algos``: every registered objective with its formula, default clips, aggregation and
source paper, read from the loss registry (so a newly registered loss shows up by itself).

The registry is read through ``gspo.config.names.losses``: the built-in losses without importing
torch (``gspo algos`` answers at once), and every registered one once ``gspo.core.losses`` is
loaded."""

from __future__ import annotations

import json
import shutil
import textwrap
from typing import Any

from gspo.config.names import losses

CLIP_MEANING = {
    "ratio": "r in [{a:g}, {b:g}] (ε_l={lo:g}, ε_h={hi:g})",
    "log-ratio": "log r in [-{lo:g}, {hi:g}]",
    "weight": "IS weight clamped to [{a:g}, {b:g}] (ε_l={lo:g}, ε_h={hi:g}), gradient kept",
    "unused": "no clip",
}


def describe(name: str) -> dict[str, Any]:
    """One registered loss as a plain dict (what ``gspo algos --json`` prints)."""
    registry = losses()
    if name not in registry:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(sorted(registry))}")
    spec = registry[name]
    lo, hi = spec.clip_low, spec.clip_high
    clip = CLIP_MEANING[spec.clip_meaning].format(lo=lo, hi=hi, a=max(0.0, 1 - lo), b=1 + hi)
    return {
        "name": spec.name,
        "formula": spec.formula,
        "clip": clip,
        "clip_low": None if spec.clip_meaning == "unused" else spec.clip_low,
        "clip_high": None if spec.clip_meaning == "unused" else spec.clip_high,
        "aggregation": spec.default_aggregation,
        "aggregations": list(spec.aggregations),
        "token_advantages": spec.token_advantages,
        "options": dict(spec.options),
        "source": spec.source,
    }


def table() -> str:
    """A Markdown table of every registered loss (test-only registrations left out)."""
    LOSSES = losses()
    lines = [
        "| algo | objective (one line) | default clip | aggregation | options | source |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(LOSSES):
        if name.startswith("test_"):
            continue
        d = describe(name)
        opts = ", ".join(f"{k}={v}" for k, v in d["options"].items()) or "-"
        cells = [name, d["formula"], d["clip"], d["aggregation"], opts, d["source"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def terminal_table(width: int | None = None) -> str:
    """Every registered loss as aligned plain text for a terminal: one block per loss, its
    fields labelled and wrapped to ``width`` (default: the terminal's)."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    labels = ("objective", "default clip", "aggregation", "options", "source")
    pad = max(len(label) for label in labels) + 4
    blocks = []
    for name in sorted(n for n in losses() if not n.startswith("test_")):
        d = describe(name)
        opts = ", ".join(f"{k}={v}" for k, v in d["options"].items()) or "-"
        values = (d["formula"], d["clip"], d["aggregation"], opts, d["source"])
        lines = [name]
        for label, value in zip(labels, values, strict=True):
            wrapped = textwrap.wrap(value, max(width - pad, 30)) or ["-"]
            lines.append(f"  {label:<{pad - 2}}{wrapped[0]}")
            lines += [" " * pad + more for more in wrapped[1:]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def add_parser(sub: Any) -> None:
    """Add ``gspo algos`` to the ``gspo`` parser's subparsers."""
    p = sub.add_parser(
        "algos",
        help="list every registered objective: formula, default clips, aggregation, paper",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--markdown", action="store_true", help="print a Markdown table (for docs) instead"
    )


def run(args: Any) -> int:
    LOSSES = losses()

    if args.json:
        names = sorted(n for n in LOSSES if not n.startswith("test_"))
        print(json.dumps([describe(n) for n in names], indent=2))
    else:
        print(table() if args.markdown else terminal_table())
        print(
            "\nClips: ε below/above 1 of the ratio unless stated; override with --clip-low/"
            "--clip-high. Options are TrainConfig fields (dual_clip, sapo_tau_pos, sapo_tau_neg)."
        )
    return 0
