"""How many of gspo's files and lines one synchronous single-turn local training step runs.

Traces the second step of a 3-step `smoke` run (the first one also builds the parts and probes
the model once; the last one also writes the final model), from the end of step 1's metrics to
the end of step 2's, in every thread. (The loop also logs the data counts at step 0, before any
training step: the window is keyed on the step of each record, not on how many were logged.) Prints the files touched, their total lines and the lines executed, then one row
per file. Used to show what a layout change does to the reach of one step:

    python scripts/step_footprint.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

import gspo
import gspo.orchestration.logging as metrics_logging
from gspo.compose.train import train
from gspo.config import TrainConfig, build

ROOT = os.path.dirname(gspo.__file__)
hits: dict[str, set[int]] = {}
logged = {"step": -1}


def tracer(frame, event, arg):
    name = frame.f_code.co_filename
    if not name.startswith(ROOT):
        return None
    if logged["step"] == 1:  # between step 1's metrics and step 2's
        hits.setdefault(name, set()).add(frame.f_lineno)
    return tracer


def main() -> None:
    original = metrics_logging.MetricsLogger.log

    def counting_log(self, step, *args, **kwargs):
        result = original(self, step, *args, **kwargs)
        logged["step"] = step
        return result

    metrics_logging.MetricsLogger.log = counting_log
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(
            output_dir=tempfile.mkdtemp(), steps=3, eval_every=0, progress=False, threads=1
        ),
    )
    sys.settrace(tracer)
    threading.settrace(tracer)
    try:
        train(cfg)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    files = sorted(hits)
    total = 0
    for name in files:
        with open(name, encoding="utf-8") as f:
            total += sum(1 for _ in f)
    executed = sum(len(lines) for lines in hits.values())
    print(f"files touched: {len(files)}; their lines: {total}; lines executed: {executed}")
    for name in files:
        print(f"{os.path.relpath(name, ROOT)} {len(hits[name])}")


if __name__ == "__main__":
    main()
