"""Time per RL step, split into rollout, old-log-prob recompute and training; tokens/s; peak memory.

Runs the real trainer (``gspo.compose.train.train``) with demo-like settings for each combination of
model size x workload x old-log-prob mode, each in a fresh subprocess so that the peak resident
memory (``ru_maxrss``, a per-process high-water mark) belongs to that configuration alone.

    python benchmarks/step_time.py                      # both sizes, both workloads, off and on
    python benchmarks/step_time.py --sizes d64L2 --recompute off --steps 3

Workloads: ``short`` is the demo (2-digit addition, 6 new tokens); ``long`` is reversal of 20
characters with 24 new tokens. Both use 16 prompts x 8 samples and 4 minibatches per step.
A random-init model rarely emits EOS, so completions run to the token limit: the numbers are
for full-length rollouts. The first step (warm-up) is not measured.

Columns: ``step s`` = rollout + recompute + train (train includes the engine weight sync);
``gen tokens/s`` = generated tokens / step time. Times are medians over the measured steps
(robust to a busy machine; every step's total is in the JSON). Prints a Markdown table, writes
JSON.

On a machine shared with other jobs, use ``--threads 1``: with 2 threads on 2 busy cores torch's
OpenMP workers wait on each other and steps ran up to ~8x slower (and erratically) here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import OUT_HELP, dated_result

WORKLOADS = {
    "short": {"task": "addition", "difficulty": None, "max_new_tokens": 6},
    "long": {"task": "reversal", "difficulty": 20, "max_new_tokens": 24},
}
SIZE_RE = re.compile(r"^d(\d+)L(\d+)(?:H(\d+))?(?:K(\d+))?$")


def parse_size(text: str) -> dict[str, int]:
    """'d128L4' -> hidden 128, 4 layers (4 heads, 2 kv heads); 'd128L4H8K4' sets heads too."""
    m = SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: expected like d64L2 or d128L4H8K4")
    hidden, layers = int(m[1]), int(m[2])
    heads = int(m[3]) if m[3] else 4
    kv = int(m[4]) if m[4] else max(1, heads // 2)
    return {"hidden_size": hidden, "num_layers": layers, "num_heads": heads, "num_kv_heads": kv}


def run_one(spec: dict) -> dict:
    """Train warm-up + measured steps in this process; return timings and peak RSS."""
    from gspo.compose.train import train
    from gspo.config import TrainConfig, build

    with tempfile.TemporaryDirectory(prefix="gspo-bench-") as tmp:
        overrides = {
            **parse_size(spec["size"]),
            **WORKLOADS[spec["workload"]],
            "prompts_per_step": 16,
            "group_size": 8,
            "num_minibatches": 4,
            "steps": spec["steps"] + 1,
            "old_logprobs": "recompute" if spec["recompute"] else "engine",
            "eval_every": 0,
            "checkpoint_every": 0,
            "progress": False,
            "device": "cpu",
            "threads": spec["threads"],
            "output_dir": tmp,
            "seed": 0,
        }
        cfg = build(TrainConfig, preset="demo", overrides=overrides)
        t0 = time.perf_counter()
        result = train(cfg)
        wall = time.perf_counter() - t0
    steps = [r for r in result.history if "time/train_s" in r][1:]  # drop the warm-up step
    n_samples = cfg.rollout.prompts_per_step * cfg.rollout.group_size

    def median(key: str) -> float:
        return statistics.median(r[key] for r in steps)

    step_s = [r["time/rollout_s"] + r["time/recompute_s"] + r["time/train_s"] for r in steps]
    tokens = [r["response_length/mean"] * n_samples for r in steps]
    return {
        **spec,
        "task": cfg.task.task,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "samples_per_step": n_samples,
        "params": sum(p.numel() for p in result.model.parameters()),
        "measured_steps": len(steps),
        "rollout_s": median("time/rollout_s"),
        "recompute_s": median("time/recompute_s"),
        "train_s": median("time/train_s"),
        "step_s": statistics.median(step_s),
        "step_s_min": min(step_s),
        "step_s_all": step_s,
        "gen_tokens_per_step": statistics.fmean(tokens),
        "gen_tokens_per_s": statistics.median(t / s for t, s in zip(tokens, step_s, strict=True)),
        "mismatch_max_abs": max((r.get("mismatch/max_abs", 0.0) for r in steps), default=0.0),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "wall_s": wall,
        "load_avg_1min_at_end": os.getloadavg()[0],
    }


def run_in_subprocess(spec: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise RuntimeError(f"benchmark {spec} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def table(rows: list[dict]) -> str:
    head = [
        "model",
        "workload",
        "params",
        "old logprobs",
        "rollout s",
        "recompute s",
        "train s",
        "step s",
        "gen tokens/s",
        "peak RSS MB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [
            r["size"],
            f"{r['workload']} ({r['task']}, {r['max_new_tokens']} tok)",
            fmt_params(r["params"]),
            "recompute" if r["recompute"] else "engine",
            f"{r['rollout_s']:.3f}",
            f"{r['recompute_s']:.3f}" if r["recompute"] else "-",
            f"{r['train_s']:.3f}",
            f"{r['step_s']:.3f}",
            f"{r['gen_tokens_per_s']:.0f}",
            f"{r['peak_rss_mb']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--steps", type=int, default=5, help="measured steps (after 1 warm-up)")
    ap.add_argument("--sizes", default="d64L2,d128L4", help="comma list like d64L2,d128L4H8")
    ap.add_argument(
        "--workloads", default="short,long", help=f"comma list of {', '.join(WORKLOADS)}"
    )
    ap.add_argument("--recompute", choices=("off", "on", "both"), default="both")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--out", default=None, help=OUT_HELP)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one config, JSON on stdout
    args = ap.parse_args(argv)
    if args.out is None:  # never overwrite committed results
        args.out = str(dated_result("step_time"))

    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return

    if args.steps < 1:
        ap.error("--steps must be >= 1")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for s in sizes:
        parse_size(s)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; valid: {', '.join(WORKLOADS)}")
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.recompute]

    rows = []
    for size in sizes:
        for workload in workloads:
            for recompute in modes:
                spec = {
                    "size": size,
                    "workload": workload,
                    "recompute": recompute,
                    "steps": args.steps,
                    "threads": args.threads,
                }
                print(f"running {spec} ...", file=sys.stderr, flush=True)
                rows.append(run_in_subprocess(spec))

    import torch
    import transformers

    report = {
        "benchmark": "step_time",
        "settings": {
            "prompts_per_step": 16,
            "group_size": 8,
            "num_minibatches": 4,
            "warmup_steps_excluded": 1,
            "measured_steps": args.steps,
            "threads": args.threads,
            "workloads": {w: WORKLOADS[w] for w in workloads},
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_avg_1min_at_end": os.getloadavg()[0],
        },
        "results": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
