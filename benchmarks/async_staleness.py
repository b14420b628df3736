"""Synchronous vs asynchronous RL (max_staleness K) for GRPO and GSPO on the addition demo.

    python benchmarks/async_staleness.py                         # K 0 1 2, grpo gspo, seeds 0 1
    python benchmarks/async_staleness.py --steps 100 --ks 0 1    # shorter
    python benchmarks/async_staleness.py --backend ray --algos gspo --ks 0 1 --seeds 0 1 \
        --steps 60 --eval-every 60
        # Ray: 1 FSDP2 rank + 1 rollout worker (--async-chunk-tokens 4), sync vs K = 1

One cold-start SFT checkpoint (250 steps, seed 1, hidden 64, as the learning tests), then every
(algo, K, seed) run starts from it with the demo preset (16 prompts x 8 samples, 6 new tokens,
4 minibatches, lr 3e-4), the same step budget, --threads 1, held-out evaluation every
``--eval-every`` steps. K = 0 is the synchronous loop; K >= 1 runs the rollout thread.

Per run: training reward (mean of the first 25 and the last 50 steps), held-out greedy accuracy
at each evaluation, wall-clock seconds of the RL run, seconds until the greedy accuracy first
reached ``--target`` (None: never), generated tokens per second of wall clock, mean staleness,
and the mean clip fractions. Writes a new dated
benchmarks/results/async_staleness-YYYYMMDD-HHMMSS.json (or --out) and prints a
Markdown table (means over seeds). Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from _results import OUT_HELP, dated_result

SHAPE = ["--hidden-size", "64", "--num-heads", "2", "--num-kv-heads", "1"]
COMMON = ["--device", "cpu", "--threads", "1", "--progress", "false"]


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run_one(main, sft: Path, out: Path, algo: str, k: int, seed: int, a: argparse.Namespace):
    args = ["train", "--preset", "demo", "--model", str(sft), "--steps", str(a.steps)]
    args += ["--algo", algo, "--lr", "3e-4", "--eval-every", str(a.eval_every)]
    args += ["--n-test", str(a.n_test)]
    args += ["--checkpoint-every", "0", "--max-staleness", str(k), "--seed", str(seed)]
    args += ["--output-dir", str(out), *COMMON]
    if a.backend == "ray":
        args += ["--backend", "ray", "--trainer-workers", "1", "--rollout-workers", "1"]
        args += ["--async-chunk-tokens", "4"]
    shutil.rmtree(out, ignore_errors=True)  # this benchmark's scratch run from a previous time
    t0 = time.perf_counter()
    assert main(args) == 0
    wall = time.perf_counter() - t0
    records = _records(out)
    steps = [r for r in records if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in steps]
    evals = [(r["step"], r["eval/greedy_accuracy"]) for r in records if "eval/greedy_accuracy" in r]
    # Wall clock to the target: the loop's own times up to the evaluation step that reached it
    # (rollout wait + recompute + train per step), evaluations themselves left out.
    per_step = {
        r["step"]: r["time/rollout_s"] + r["time/recompute_s"] + r["time/train_s"] for r in steps
    }
    reached = next((s for s, acc in evals if acc >= a.target), None)
    to_target = None if reached is None else sum(v for s, v in per_step.items() if s <= reached)
    loop_s = sum(per_step.values())
    tokens = sum(r["response_length/mean"] * 128 for r in steps)  # 16 prompts x 8 samples
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / len(steps)  # noqa: E731
    return {
        "algo": algo,
        "k": k,
        "seed": seed,
        "reward_first25": sum(rewards[:25]) / 25,
        "reward_last50": sum(rewards[-50:]) / 50,
        "greedy": evals,
        "wall_s": wall,
        "loop_s": loop_s,
        "s_per_step": loop_s / len(steps),
        "rollout_wait_s": mean("time/rollout_s"),  # the trainer's wait (sync: the rollout)
        "to_target_s": to_target,
        "tokens_per_s": tokens / loop_s,
        "staleness_mean": mean("async/staleness_mean"),
        "partial_fraction": mean("async/partial_fraction"),
        "clip_seq_fraction": mean("clip/seq_fraction"),
        "kl_old_new": mean("kl/old_new"),
    }


def main_(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--algos", nargs="+", default=["grpo", "gspo"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--target", type=float, default=0.35, help="greedy accuracy for to_target_s")
    p.add_argument("--n-test", type=int, default=800, help="held-out problems per evaluation")
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    p.add_argument("--work", default="/tmp/gspo-async-bench")
    p.add_argument("--out", default=None, help=OUT_HELP.replace("NAME", "async_staleness[_ray]"))
    a = p.parse_args(argv)
    if a.out is None:  # never overwrite committed results
        a.out = str(dated_result("async_staleness" + ("_ray" if a.backend == "ray" else "")))
    from gspo.interface.cli import main

    work = Path(a.work)
    sft = work / "sft"
    if not (sft / "config.json").exists():
        args = ["sft", "--task", "addition", *SHAPE, "--steps", "250", "--max-new-tokens", "6"]
        assert main([*args, "--seed", "1", "--output-dir", str(sft), *COMMON]) == 0
    runs = []
    for algo in a.algos:
        for k in a.ks:
            for seed in a.seeds:
                out = work / f"{a.backend}-{algo}-k{k}-s{seed}"
                runs.append(run_one(main, sft, out, algo, k, seed, a))
                print(json.dumps(runs[-1]), flush=True)
    comparisons = paired(runs, a.n_test)
    result = {
        "machine": platform.processor() or platform.machine(),
        "args": vars(a),
        "runs": runs,
        "comparisons": {m: [c.to_json() for c in cs] for m, cs in comparisons.items()},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(table(runs, a.target))
    for metric, cs in comparisons.items():
        print(f"\n{metric}, each K against K = 0 of its algorithm, paired by seed:")
        for c in cs:
            print("  " + c.line())


def paired(runs: list[dict[str, Any]], n_test: int) -> dict[str, list]:
    """Every (algo, K > 0) against (algo, K = 0), paired by seed (DESIGN.md, "How learning is
    compared"): the final held-out greedy accuracy and the last-50-step train reward."""
    from gspo.core.comparison import compare_paired

    def by_seed(algo: str, k: int, value) -> dict[int, float]:
        return {r["seed"]: value(r) for r in runs if r["algo"] == algo and r["k"] == k}

    metrics = {
        "final held-out greedy accuracy": (lambda r: r["greedy"][-1][1], n_test),
        "train reward, last 50 steps": (lambda r: r["reward_last50"], None),
    }
    keys = sorted({(r["algo"], r["k"]) for r in runs if r["k"] > 0})
    shared = {algo: sum(a == algo for a, _ in keys) for algo, _ in keys}
    return {
        name: [
            compare_paired(
                by_seed(algo, k, value),
                by_seed(algo, 0, value),
                names=(f"{algo} K={k}", f"{algo} K=0"),
                problems=problems,
                shared_baseline=shared[algo],
            )
            for algo, k in keys
        ]
        for name, (value, problems) in metrics.items()
    }


def table(runs: list[dict[str, Any]], target: float) -> str:
    head = (
        f"| algo | K | reward first 25 -> last 50 | greedy start -> end | loop s | "
        f"s to greedy >= {target} (runs reaching) | tokens/s | staleness | partial | clip seq | "
        "s/step (loop) | trainer waits for rollouts s/step |"
    )
    lines = [head, "|" + " --- |" * 12]
    keys = sorted({(r["algo"], r["k"]) for r in runs})
    for algo, k in keys:
        rs = [r for r in runs if r["algo"] == algo and r["k"] == k]
        m = lambda key, rs=rs: sum(r[key] for r in rs) / len(rs)  # noqa: E731
        hit = [r["to_target_s"] for r in rs if r["to_target_s"] is not None]
        to = f"{sum(hit) / len(hit):.1f} ({len(hit)}/{len(rs)})" if hit else f"- (0/{len(rs)})"
        g0 = sum(r["greedy"][0][1] for r in rs) / len(rs)
        g1 = sum(r["greedy"][-1][1] for r in rs) / len(rs)
        lines.append(
            f"| {algo} | {k} | {m('reward_first25'):.3f} -> {m('reward_last50'):.3f} | "
            f"{g0:.3f} -> {g1:.3f} | {m('loop_s'):.1f} | {to} | {m('tokens_per_s'):.0f} | "
            f"{m('staleness_mean'):.2f} | {m('partial_fraction'):.3f} | "
            f"{m('clip_seq_fraction'):.3f} | {m('s_per_step'):.3f} | "
            f"{m('rollout_wait_s'):.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main_()
