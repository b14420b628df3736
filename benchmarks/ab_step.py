"""Two checkouts of gspo, side by side: the ``gspo`` step of ``vs_trl.py`` on each, alternating
(A B, then B A, ...) in one invocation, so that a drift in machine load hits both alike.

    git worktree add /tmp/gspo-base int37        # or: git archive int37 | tar -x -C /tmp/gspo-base
    python benchmarks/ab_step.py --a /tmp/gspo-base --b . --workloads d64-add,d128-rev \\
        --steps 10 --reps 3 --threads 1 --cache /tmp/vs-trl-cache

Each run is ``<checkout>/benchmarks/vs_trl.py --one`` in a subprocess with
``PYTHONPATH=<checkout>/src``: the checkout's own package and its own benchmark code, on the
same SFT cold start (made once by this checkout's ``vs_trl.prepare_init``, shared through
``--cache``). Prints per workload the median seconds per step (first step excluded, as in
``vs_trl.py``) and the rollout seconds of A and B, the ratio A / B (above 1: B is faster), and
the 1-minute load average at each run; writes every run to a new JSON file (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl
from _results import OUT_HELP, dated_result


def run_one(checkout: Path, spec: dict) -> dict:
    """One ``vs_trl.py --one`` run of ``spec`` with ``checkout``'s code."""
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout / "src"),
        "OMP_NUM_THREADS": str(spec["threads"]),
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [sys.executable, str(checkout / "benchmarks" / "vs_trl.py"), "--one", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"run in {checkout} failed ({proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--a", required=True, help="checkout A (the baseline)")
    ap.add_argument("--b", default=".", help="checkout B (default: this one)")
    ap.add_argument("--workloads", default="d64-add,d128-rev")
    ap.add_argument("--steps", type=int, default=10, help="RL steps per run (first: warm-up)")
    ap.add_argument("--reps", type=int, default=3, help="runs of each checkout per workload")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default=None, help="folder for the SFT cold starts")
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    checkouts = {"A": Path(args.a).resolve(), "B": Path(args.b).resolve()}
    for name, path in checkouts.items():
        if not (path / "benchmarks" / "vs_trl.py").is_file():
            ap.error(f"--{name.lower()} {path}: no benchmarks/vs_trl.py there")
    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="vs-trl-cache-"))
    cache.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list[dict]]] = {}
    for workload in [w for w in args.workloads.split(",") if w]:
        init, _ = vs_trl.prepare_init(workload, args.threads, cache)
        for rep in range(args.reps):
            for name in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                spec = {
                    "workload": workload,
                    "system": "gspo",
                    "init": init,
                    "steps": args.steps,
                    "threads": args.threads,
                    "n_test": 200,
                    "eval": False,
                    "reward_window": 5,
                    "rep": rep,
                    "seed": vs_trl.SEED,
                }
                load = os.getloadavg()[0]
                r = run_one(checkouts[name], spec)
                r["load_avg_1min_at_start"] = load
                print(
                    f"{workload} rep {rep} {name}: {r['step_s']:.3f} s/step "
                    f"(rollout {r['rollout_s']:.3f} s, load {load:.1f}, reward "
                    f"{r['reward_last']:.4f})",
                    file=sys.stderr,
                    flush=True,
                )
                runs.setdefault(workload, {}).setdefault(name, []).append(r)
    print("| workload | A s/step | B s/step | A / B | A rollout s | B rollout s | load (1 min) |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for workload, by in runs.items():
        a = statistics.median(r["step_s"] for r in by["A"])
        b = statistics.median(r["step_s"] for r in by["B"])
        ra = statistics.median(r["rollout_s"] for r in by["A"])
        rb = statistics.median(r["rollout_s"] for r in by["B"])
        loads = [r["load_avg_1min_at_start"] for rs in by.values() for r in rs]
        summary[workload] = {"a_step_s": a, "b_step_s": b, "ratio": a / b}
        print(
            f"| {workload} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {ra:.3f} | {rb:.3f} | "
            f"{min(loads):.1f}-{max(loads):.1f} |"
        )
    path = Path(args.out) if args.out else dated_result("ab_step")
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "ab_step",
        "command": " ".join(["python benchmarks/ab_step.py", *(argv or sys.argv[1:])]),
        "checkouts": {k: str(v) for k, v in checkouts.items()},
        "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "summary": summary,
        "runs": runs,
    }
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
