"""Compare two runs' metrics.jsonl record by record, leaving out wall-clock fields.

    python scripts/metrics_diff.py runs/a/metrics.jsonl runs/b/metrics.jsonl

Prints each differing record (at most 5) and exits 1 when any differs, 0 when the runs logged
the same records, keys in the same order and the same values (``time/*``, ``throughput/*`` and
``async/*_idle_s`` aside). Used to show that a refactor leaves a seeded run unchanged.
"""

from __future__ import annotations

import json
import sys

CLOCK_PREFIXES = ("time/", "throughput/")


def _records(path: str) -> list[dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        {
            k: v
            for k, v in r.items()
            if not k.startswith(CLOCK_PREFIXES) and not k.endswith("_idle_s")
        }
        for r in rows
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = _records(argv[0]), _records(argv[1])
    bad = [
        i for i, (x, y) in enumerate(zip(a, b, strict=False)) if list(x.items()) != list(y.items())
    ]
    for i in bad[:5]:
        keys = [k for k in dict.fromkeys([*a[i], *b[i]]) if a[i].get(k) != b[i].get(k)]
        print(f"record {i}: " + ", ".join(f"{k}: {a[i].get(k)!r} != {b[i].get(k)!r}" for k in keys))
    if len(a) != len(b):
        print(f"{len(a)} records vs {len(b)}")
    print(f"{len(a)} vs {len(b)} records, {len(bad)} differ")
    return 1 if bad or len(a) != len(b) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
