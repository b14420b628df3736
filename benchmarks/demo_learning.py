"""``gspo demo`` at two RL lengths, compared as DESIGN.md asks: paired by seed, held-out greedy
accuracy on 800 problems, the paired difference with its 95% interval and MDE.

    python benchmarks/demo_learning.py --seeds 0-9 --steps 100,800 --threads 1

For each seed, ``gspo demo --seed S --steps N`` runs once per N in a new temporary folder (the
runs of one seed share the cold start: the SFT phase is the same computation), then
``gspo eval`` scores its final model and its SFT start on ``--n-test`` held-out problems of the
run's own test split (``--seed S``: disjoint from its training problems). Prints one row per
seed and the comparison of every N against the first (gspo.core.comparison); writes the runs to
a new JSON file (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import OUT_HELP, dated_result

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW_TOKENS = 6  # the demo preset's


def parse_seeds(text: str) -> list[int]:
    """'0-9' or '0,3,5'."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",") if s]


def gspo(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(
        [sys.executable, "-m", "gspo.interface.cli", *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def held_out(model: Path, seed: int, n_test: int, threads: int, out: Path) -> float:
    """Greedy exact-match accuracy of ``model`` on the seed's first ``n_test`` test problems."""
    gspo("eval", "--model", str(model), "--task", "addition", "--seed", str(seed),
         "--n-test", str(n_test), "--samples", "0", "--max-new-tokens", str(MAX_NEW_TOKENS),
         "--threads", str(threads), "--output", str(out))  # fmt: skip
    return float(json.loads(out.read_text())["metrics"]["greedy_accuracy"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-9", help="'0-9' or '0,1,2' [0-9]")
    ap.add_argument("--steps", default="100,800", help="RL steps to compare [100,800]")
    ap.add_argument("--n-test", type=int, default=800, help="held-out problems [800]")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    from gspo.core.comparison import compare_paired

    seeds = parse_seeds(args.seeds)
    lengths = [int(s) for s in args.steps.split(",")]
    out = Path(args.out) if args.out else dated_result("demo_learning")
    scores: dict[str, dict[int, float]] = {"sft": {}, **{str(n): {} for n in lengths}}
    seconds: dict[str, dict[int, float]] = {str(n): {} for n in lengths}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="demo-learning-") as tmp:
        for seed in seeds:
            for n in lengths:
                run = Path(tmp) / f"s{seed}-n{n}"
                t0 = time.time()
                gspo("demo", "--seed", str(seed), "--steps", str(n), "--threads",
                     str(args.threads), "--progress", "false", "--output-dir", str(run))  # fmt: skip
                seconds[str(n)][seed] = time.time() - t0
                scores[str(n)][seed] = held_out(
                    run / "rl" / "final", seed, args.n_test, args.threads, run / "eval.json"
                )
                if seed not in scores["sft"]:
                    scores["sft"][seed] = held_out(
                        run / "sft", seed, args.n_test, args.threads, run / "eval-sft.json"
                    )
            row = " ".join(f"{n} steps {scores[str(n)][seed]:.3f}" for n in lengths)
            print(
                f"[{time.time() - started:6.0f}s] seed {seed}: SFT {scores['sft'][seed]:.3f}, {row}",
                flush=True,
            )
    base = str(lengths[0])
    comparisons = [
        compare_paired(
            scores[str(n)],
            scores[base],
            names=(f"{n} steps", f"{base} steps"),
            problems=args.n_test,
            shared_baseline=len(lengths) - 1,
        )
        for n in lengths[1:]
    ]
    comparisons.append(
        compare_paired(
            scores[base], scores["sft"], names=(f"{base} steps", "SFT start"), problems=args.n_test
        )
    )
    print(f"\nheld-out greedy accuracy, {args.n_test} problems per run, paired by seed:")
    for c in comparisons:
        print("  " + c.line())
    report = {
        "benchmark": "demo_learning",
        "command": " ".join(["python benchmarks/demo_learning.py", *(argv or sys.argv[1:])]),
        "seeds": seeds,
        "steps": lengths,
        "n_test": args.n_test,
        "held_out_greedy": {k: {str(s): v for s, v in d.items()} for k, d in scores.items()},
        "demo_seconds": {k: {str(s): v for s, v in d.items()} for k, d in seconds.items()},
        "comparisons": [c.to_json() for c in comparisons],
        "load_avg_at_end": os.getloadavg(),
        "wall_s": time.time() - started,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
