"""The compiled update's cost and when it pays (``vs_trl.py --compile``): the compile seconds of
``gspo-compile`` and the step at which it has caught up with eager ``gspo``.

Compile seconds: the first calls of each new graph (shape bucket), timed inside the run
(gspo.models.compiled_forward.RECORD: trace, compile or cache load of the forward and
backward graphs, and one run of each). Repetition 0 compiles into the invocation's empty
inductor cache (cold); later repetitions find the graphs of the same shapes there (warm:
dynamo still traces).

Break-even: compile seconds over the per-step saving (eager median - compiled median, steps
after the first), i.e. how many steps a run needs before the compiled one is ahead; never when
compiled steps are not faster.
"""

from __future__ import annotations

import statistics
from typing import Any

COMPILED, EAGER = "gspo-compile", "gspo"


def compile_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per repetition of the compiled system: graphs, compile seconds, per-step saving against
    eager's median and the break-even step; [] unless both systems ran."""
    if COMPILED not in runs or EAGER not in runs:
        return []
    eager_step = statistics.median(r["step_s"] for r in runs[EAGER])
    rows = []
    for comp in runs[COMPILED]:
        cost = comp["compile_first_call_s"]
        saving = eager_step - comp["step_s"]
        rows.append(
            {
                "rep": comp["rep"],
                "cache": "cold" if comp["rep"] == 0 else "warm",
                "graphs": comp["compile_graphs"],
                "compile_s": cost,
                "step_s": comp["step_s"],
                "eager_step_s": eager_step,
                "saving_s": saving,
                "break_even_step": cost / saving if saving > 0 else None,
            }
        )
    return rows


def compile_table(by_workload: dict[str, list[dict[str, Any]]]) -> str:
    head = [
        "workload",
        "rep",
        "inductor cache",
        "graphs",
        "compile s",
        "s/step compiled",
        "s/step eager (median)",
        "saving s/step",
        "break-even step",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for workload, rows in by_workload.items():
        for r in rows:
            be = r["break_even_step"]
            cells = [
                workload,
                str(r["rep"]),
                r["cache"],
                str(r["graphs"]),
                f"{r['compile_s']:.1f}",
                f"{r['step_s']:.3f}",
                f"{r['eager_step_s']:.3f}",
                f"{r['saving_s']:+.3f}",
                "never" if be is None else f"{be:.0f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
