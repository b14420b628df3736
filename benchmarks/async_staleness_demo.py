"""Does asynchronous RL at staleness 1 learn like synchronous RL on the demo? Several seeds.

    python benchmarks/async_staleness_demo.py                    # seeds 0 1 2, K 0 and 1, local
    python benchmarks/async_staleness_demo.py --seeds 0 1 2 3 4 --steps 400
    python benchmarks/async_staleness_demo.py --backend ray      # 1 FSDP2 rank + 1 rollout worker
    python benchmarks/async_staleness_demo.py --cold-start stored --lr 3e-4 --steps 300 \
        --seeds 0 1 2 3 4 [--decoupled]      # a mid-range start, where a slowdown has room to show

Per seed S: the demo's own cold start, made once per seed and shared by both settings
(``gspo demo --seed S --threads 1 --steps 1``: its ``sft/`` folder is the checkpoint the demo's
RL phase starts from; the one RL step it also runs is thrown away). Then the demo's RL phase
(``gspo train --preset demo --model DEMO/sft --seed S --threads 1``, 800 steps, held-out
evaluation every 25) for K = 0 (the synchronous loop) and K = 1 (``--max-staleness 1``), each in
a fresh process. The two settings alternate, in ABBA order over seeds (0: K0 K1, 1: K1 K0, ...),
so that a change in the machine's load falls on both alike.

``--cold-start stored``: the learning tests' stored checkpoint instead, shared by every seed.
``--decoupled``: the K >= 1 runs recompute the old log-probs and weight by pi_old / pi_behaviour
(truncated). ``--reuse FILE``: take the runs an earlier invocation made with the same settings.
Results and their reading: benchmarks/results/async_staleness_demo.md.

Per setting: the final held-out greedy accuracy (200 problems), the mean of the last four
evaluations (less noisy than one) and of all after step 0 (learning speed), the training reward of the last 50 steps, as
mean ± standard error over seeds (sample sd / sqrt(n)); the same for the paired difference
K1 - K0 (same seed, same start); and wall time of the RL process. Writes a new dated
benchmarks/results/async_staleness_demo-YYYYMMDD-HHMMSS.json (or --out) and prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _results import OUT_HELP, dated_result

# of results files written before these flags
DEFAULTS = {"lr": None, "cold_start": "demo", "n_test": 200, "eval_every": None}
ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
# The default tiny model after 250 SFT steps, the same on every machine (a fresh SFT's start
# depends on the CPU's float reduction order): mid-range, where a difference has room to show.
STORED = ROOT / "tests" / "data" / "cold_start" / "addition_d64"


def gspo(args: list[str], log: Path) -> float:
    """``gspo ARGS`` in a fresh process (output to ``log``); its wall-clock seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.call(
            [sys.executable, "-m", "gspo.interface.cli", *args], stdout=f, stderr=f, env=env
        )
    wall = time.perf_counter() - t0
    if rc != 0:
        sys.exit(f"gspo {' '.join(args)} exited {rc}; its output: {log}")
    return wall


def demo_sft(work: Path, seed: int) -> Path:
    """The demo's cold-start checkpoint for ``seed`` (made once, kept in ``work``)."""
    out = work / f"demo-s{seed}"
    if not (out / "sft.json").is_file():  # written by the demo once its SFT has finished
        shutil.rmtree(out, ignore_errors=True)  # an unfinished one from a previous time
        args = ["demo", "--seed", str(seed), "--threads", "1", "--steps", "1"]
        gspo([*args, "--progress", "false", "--output-dir", str(out)], work / f"demo-s{seed}.log")
    return out / "sft"


def run_one(sft: Path, out: Path, k: int, seed: int, a: argparse.Namespace) -> dict[str, Any]:
    args = ["train", "--preset", "demo", "--model", str(sft), "--seed", str(seed)]
    args += ["--algo", a.algo, "--steps", str(a.steps), "--max-staleness", str(k)]
    args += ["--threads", "1", "--device", "cpu", "--progress", "false"]
    args += ["--checkpoint-every", "0", "--output-dir", str(out)]
    args += ["--n-test", str(a.n_test)]
    if a.lr is not None:
        args += ["--lr", str(a.lr)]
    if a.eval_every is not None:
        args += ["--eval-every", str(a.eval_every)]
    if a.decoupled and k >= 1:
        args += ["--old-logprobs", "recompute", "--mismatch-correction", "truncate"]
    if a.backend == "ray":
        args += ["--backend", "ray", "--trainer-workers", "1", "--rollout-workers", "1"]
    shutil.rmtree(out, ignore_errors=True)  # this benchmark's scratch run from a previous time
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    wall = gspo(args, log)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    evals = [r for r in records if "eval/greedy_accuracy" in r]
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / len(steps)  # noqa: E731
    loop = sum(r["time/rollout_s"] + r["time/recompute_s"] + r["time/train_s"] for r in steps)
    return {
        "k": k,
        "seed": seed,
        "decoupled": a.decoupled and k >= 1,
        "greedy": [(r["step"], r["eval/greedy_accuracy"]) for r in evals],
        "pass1": [(r["step"], r["eval/pass@1"]) for r in evals],
        "greedy_final": evals[-1]["eval/greedy_accuracy"],
        "greedy_final_se": evals[-1].get("eval/greedy_accuracy_se"),
        "greedy_last4": sum(r["eval/greedy_accuracy"] for r in evals[-4:]) / len(evals[-4:]),
        # over every evaluation after step 0: how fast it learned, not only where it ended
        "greedy_mean": sum(r["eval/greedy_accuracy"] for r in evals[1:]) / len(evals[1:]),
        "pass1_final": evals[-1]["eval/pass@1"],
        "reward_last50": sum(r["reward/mean"] for r in steps[-50:]) / len(steps[-50:]),
        "wall_s": wall,
        "loop_s": loop,
        "rollout_wait_s_per_step": mean("time/rollout_s"),
        "staleness_mean": mean("async/staleness_mean"),
        "dropped_samples": sum(r.get("async/dropped_samples", 0.0) for r in steps),
        "partial_fraction": mean("async/partial_fraction"),
        "clip_seq_fraction": mean("clip/seq_fraction"),
        "kl_old_new": mean("kl/old_new"),
        "steps_logged": len(steps),
    }


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def fmt(xs: list[float], digits: int = 3) -> str:
    m, se = mean_se(xs)
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def table(runs: list[dict[str, Any]]) -> str:
    cols = [
        ("greedy_final", "final greedy acc"),
        ("greedy_last4", "greedy acc, last 4 evals"),
        ("greedy_mean", "greedy acc, mean of evals 25..end"),
        ("pass1_final", "final pass@1"),
        ("reward_last50", "reward, last 50 steps"),
    ]
    head = "| K | seeds | " + " | ".join(c for _, c in cols) + " | wall s | per seed (final) |"
    lines = [head, "|" + " --- |" * (len(cols) + 4)]
    ks = sorted({r["k"] for r in runs})
    for k in ks:
        rs = sorted((r for r in runs if r["k"] == k), key=lambda r: r["seed"])
        vals = " | ".join(fmt([r[key] for r in rs]) for key, _ in cols)
        per = ", ".join(f"{r['greedy_final']:.3f}" for r in rs)
        wall = fmt([r["wall_s"] for r in rs], 0)
        lines.append(f"| {k} | {len(rs)} | {vals} | {wall} | {per} |")
    for k in ks[1:]:  # paired by seed against the synchronous run
        pairs = [
            (r1, r0)
            for r1 in runs
            if r1["k"] == k
            for r0 in runs
            if r0["k"] == ks[0] and r0["seed"] == r1["seed"]
        ]
        if len(pairs) < 2:
            continue
        d = " | ".join(fmt([r1[key] - r0[key] for r1, r0 in pairs]) for key, _ in cols)
        wall = fmt([r1["wall_s"] - r0["wall_s"] for r1, r0 in pairs], 0)
        per = ", ".join(f"{r1['greedy_final'] - r0['greedy_final']:+.3f}" for r1, r0 in pairs)
        lines.append(f"| {k} - {ks[0]} (paired) | {len(pairs)} | {d} | {wall} | {per} |")
    return "\n".join(lines)


def reused(a: argparse.Namespace) -> dict[tuple[int, int], dict[str, Any]]:
    """Runs of the earlier results files made with this invocation's settings, by (K, seed)."""
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for name in a.reuse:
        data = json.loads(Path(name).read_text())
        keys = ("steps", "algo", "backend", "lr", "cold_start", "n_test", "eval_every")
        same = all(data["args"].get(key, DEFAULTS.get(key)) == getattr(a, key) for key in keys)
        decoupled = data["args"].get("decoupled", False)
        for r in data["runs"] if same else []:
            if r["k"] >= 1 and decoupled != a.decoupled:  # the synchronous runs are the same
                continue
            r.setdefault("greedy_mean", statistics.fmean(acc for _, acc in r["greedy"][1:]))
            found.setdefault((r["k"], r["seed"]), {**r, "from": Path(name).name})
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ks", type=int, nargs="+", default=[0, 1], help="max staleness values")
    p.add_argument("--steps", type=int, default=800, help="RL steps [the demo's 800]")
    p.add_argument("--algo", default="gspo", help="[the demo's gspo]")
    p.add_argument("--lr", type=float, default=None, help="[the demo preset's 1e-4]")
    p.add_argument("--n-test", type=int, default=800, help="held-out problems [800]")
    p.add_argument("--eval-every", type=int, default=None, help="[the demo preset's 25]")
    p.add_argument(
        "--cold-start",
        choices=["demo", "stored"],
        default="demo",
        help="demo: the demo's own SFT, one per seed; stored: the learning tests' stored one "
        "(tests/data/cold_start/addition_d64, greedy accuracy 0.555), shared by the seeds [demo]",
    )
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    p.add_argument("--work", default="/tmp/gspo-async-demo-bench", help="scratch runs")
    p.add_argument(
        "--decoupled",
        action="store_true",
        help="K >= 1 runs with the decoupled objective: --old-logprobs recompute (the trainer's "
        "weights before the step are the clip's old policy) --mismatch-correction truncate "
        "(weights pi_old / pi_behaviour, capped at 2)",
    )
    p.add_argument(
        "--reuse",
        nargs="+",
        default=[],
        metavar="JSON",
        help="results files of earlier invocations: their runs of the same (K, seed, steps, "
        "algo, backend) are taken instead of run again",
    )
    p.add_argument("--out", default=None, help=OUT_HELP.replace("NAME", "async_staleness_demo"))
    a = p.parse_args(argv)
    if a.out is None:  # never overwrite committed results
        a.out = str(dated_result("async_staleness_demo" + ("_ray" if a.backend == "ray" else "")))
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    earlier = reused(a)
    # file names only: the results are committed, the machine's folders mean nothing
    args = {**vars(a), "out": Path(a.out).name, "reuse": [Path(n).name for n in a.reuse]}
    result = {"machine": platform.processor() or platform.machine(), "args": args}
    runs: list[dict[str, Any]] = []
    for i, seed in enumerate(a.seeds):
        for k in a.ks if i % 2 == 0 else a.ks[::-1]:  # ABBA: load drift hits both settings
            if (k, seed) in earlier:
                runs.append(earlier[k, seed])
            else:
                name = f"{a.cold_start}-{a.backend}-{a.algo}-k{k}-s{seed}"
                out = work / (name + ("-decoupled" if a.decoupled and k >= 1 else ""))
                sft = demo_sft(work, seed) if a.cold_start == "demo" else STORED
                runs.append(run_one(sft, out, k, seed, a))
                print(json.dumps({n: v for n, v in runs[-1].items() if n != "pass1"}), flush=True)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({**result, "runs": runs}, indent=2))
    comparisons = paired(runs, a.n_test)
    result["comparisons"] = {m: [c.to_json() for c in cs] for m, cs in comparisons.items()}
    Path(a.out).write_text(json.dumps({**result, "runs": runs}, indent=2))
    print(table(runs))
    for metric, cs in comparisons.items():
        print(f"\n{metric}, each K against K = {min(r['k'] for r in runs)}, paired by seed:")
        for c in cs:
            print("  " + c.line())


COMPARED = {
    "greedy_final": "final held-out greedy accuracy",
    "greedy_mean": "held-out greedy accuracy, mean of the evaluations after step 0",
    "reward_last50": "train reward, last 50 steps",
}


def paired(runs: list[dict[str, Any]], n_test: int) -> dict[str, list]:
    """Each K against the lowest (DESIGN.md, "How learning is compared"): paired by seed, the
    interval, the MDE and a verdict."""
    sys.path.insert(0, str(SRC))  # the checkout's gspo, as the runs themselves use
    from gspo.core.comparison import compare_paired

    ks = sorted({r["k"] for r in runs})
    by_seed = lambda k, key: {r["seed"]: r[key] for r in runs if r["k"] == k}  # noqa: E731
    return {
        name: [
            compare_paired(
                by_seed(k, key),
                by_seed(ks[0], key),
                names=(f"K={k}", f"K={ks[0]}"),
                problems=None if key == "reward_last50" else n_test,
                shared_baseline=len(ks) - 1,
            )
            for k in ks[1:]
        ]
        for key, name in COMPARED.items()
    }


if __name__ == "__main__":
    main()
