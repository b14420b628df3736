"""Where a benchmark writes its results: a new dated file in benchmarks/results/ unless
``--out`` names one, so a run never overwrites the committed results it may be compared with."""

from __future__ import annotations

import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OUT_HELP = "results file [a new dated one: benchmarks/results/NAME-YYYYMMDD-HHMMSS.json]"


def dated_result(name: str, when: float | None = None) -> Path:
    """``results/<name>-<UTC date and time>.json``, never an existing file."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if when is None else when))
    path = RESULTS / f"{name}-{stamp}.json"
    n = 2
    while path.exists():
        path = RESULTS / f"{name}-{stamp}-{n}.json"
        n += 1
    return path
