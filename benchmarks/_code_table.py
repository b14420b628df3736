"""The table a code-reward check prints and saves: each kind of completion scored through
``gspo.envs.rewards.score(code_reward, ...)`` as the trainer scores it, at each worker count.
Shared by ``humaneval.py`` and ``mbpp.py``."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path

from gspo.envs.rewards import score
from gspo.envs.tasks import Example
from gspo.sandbox import code_reward, isolation

RESULTS = Path(__file__).resolve().parent / "results"

WANT = {"reference": 1.0, "no imports": 1.0, "wrong": 0.0}
"""The score each checked kind must get; other kinds (``returns None``) are reported only."""


def score_rows(
    examples: Sequence[Example], texts: Sequence[dict[str, str]], workers: Sequence[int]
) -> tuple[list[dict], list[str]]:
    """(one row per kind and worker count, the unexpected scores as ``kind (workers): id``)."""
    print(isolation().summary())  # also warms the sandbox up
    rows, failures = [], []
    for kind in texts[0]:
        batch = [t[kind] for t in texts]
        for n in workers:
            start = time.perf_counter()
            rewards, errors = score(code_reward, batch, list(examples), workers=n)
            seconds = time.perf_counter() - start
            want = WANT.get(kind, 1.0)
            bad = [e.meta["task_id"] for e, r in zip(examples, rewards, strict=True) if r != want]
            if kind in WANT:
                failures += [f"{kind} (workers {n}): {task_id}" for task_id in bad]
            rows.append(
                {
                    "completion": kind,
                    "workers": n,
                    "problems": len(examples),
                    "as_expected": len(examples) - len(bad) if kind in WANT else None,
                    "full_score": sum(r == 1.0 for r in rewards),
                    "zero_score": sum(r == 0.0 for r in rewards),
                    "mean_reward": sum(rewards) / len(rewards),
                    "errors": errors,
                    "seconds": seconds,
                    "seconds_per_problem": seconds / len(examples),
                }
            )
    return rows, failures


def print_table(title: str, rows: Sequence[dict]) -> None:
    print(f"\n{title}, {rows[0]['problems']} problems, {os.cpu_count()} cores\n")
    print(
        "| completion | workers | passed all tests | scored 0 | mean reward | seconds | s / problem |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['completion']} | {row['workers']} | {row['full_score']}/{row['problems']} "
            f"| {row['zero_score']}/{row['problems']} | {row['mean_reward']:.3f} "
            f"| {row['seconds']:.1f} | {row['seconds_per_problem']:.3f} |"
        )


def out_path(name: str, given: str | None) -> Path:
    """``--out``, else a new dated file: <name>_<date>.json, then _2, _3... if taken."""
    if given:
        return Path(given)
    stem = f"{name}_{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"
    path, n = RESULTS / f"{stem}.json", 2
    while path.exists():
        path, n = RESULTS / f"{stem}_{n}.json", n + 1
    return path


def write_record(
    name: str, command: str, given: str | None, rows: list[dict], failures: list[str], **extra
) -> None:
    """Write the JSON record, print where, and list the first unexpected scores."""
    out = out_path(name, given)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "isolation": sorted(isolation().mechanisms),
        **extra,
        "rows": rows,
        "unexpected": failures,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {out}")
    for line in failures[:20]:
        print(f"unexpected score: {line}")
