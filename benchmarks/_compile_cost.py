"""The compiled update's cost and when it pays (``vs_trl.py --compile``): the cold compile
seconds of ``gspo-compile`` and the step at which it has caught up with eager ``gspo``.

A run's *excess* is its wall time beyond its own steady pace: sum over every step (the
warm-up included) of (step time - median step time after the warm-up). Eager gspo has some
(the first step's allocations, imports); the compiled run's excess beyond eager's, in the same
repetition, is the compile cost. Repetition 0 compiles into an empty inductor cache (cold);
later repetitions find the graphs of the same shapes there (warm: dynamo still traces).

Break-even: the compile cost over the per-step saving (eager median - compiled median), in
steps after the warm-up; none when compiled steps are not faster.
"""

from __future__ import annotations

import statistics
from typing import Any

COMPILED, EAGER = "gspo-compile", "gspo"


def excess_s(step_s_all: list[float]) -> float:
    """Seconds beyond the run's median pace (steps after the first), over all its steps."""
    steady = statistics.median(step_s_all[1:] or step_s_all)
    return sum(s - steady for s in step_s_all)


def compile_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per repetition: graphs compiled, compile cost (excess over eager's), per-step saving and
    the break-even step; [] unless both systems ran."""
    if COMPILED not in runs or EAGER not in runs:
        return []
    eager_step = statistics.median(r["step_s"] for r in runs[EAGER])
    rows = []
    for comp, eager in zip(runs[COMPILED], runs[EAGER], strict=False):
        cost = excess_s(comp["step_s_all"]) - excess_s(eager["step_s_all"])
        saving = eager_step - comp["step_s"]
        rows.append(
            {
                "rep": comp["rep"],
                "cache": "cold" if comp["rep"] == 0 else "warm",
                "graphs": comp.get("compile_graphs"),
                "first_calls_s": comp.get("compile_first_call_s"),
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
        "s/step eager",
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
