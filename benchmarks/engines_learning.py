"""Does GSPO learn as well with vLLM rollouts as with the torch engine? Same checkpoint, seeds
and budget, on the addition demo.

    python benchmarks/engines_learning.py                 # seeds 0,1,2, 150 RL steps each
    python benchmarks/engines_learning.py --seeds 0 --steps 60

A cold start (SFT, 400 steps, seed 2, d64 with 2 heads: vLLM's CPU attention needs a head size
of at least 32) is shared by every run; then `gspo train --preset demo --lr 3e-4` for each seed
with `--rollout-engine torch` and `--rollout-engine vllm`. Reports the mean training reward of
the first 25 and the last 50 steps and the held-out greedy accuracy (200 problems) at the start
and the end, a Markdown table, and JSON in a new dated
benchmarks/results/engines_learning-YYYYMMDD-HHMMSS.json (or --output).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _results import OUT_HELP, dated_result

from gspo.interface.cli import main as gspo

SHAPE = ["--hidden-size", "64", "--num-heads", "2", "--num-kv-heads", "1"]
COMMON = ["--device", "cpu", "--threads", "1", "--progress", "false"]


def run(workdir: Path, sft: Path, engine: str, seed: int, steps: int) -> dict:
    out = workdir / f"{engine}-{seed}"
    t0 = time.perf_counter()
    args = ["train", "--preset", "demo", "--model", str(sft), "--steps", str(steps)]
    args += ["--lr", "3e-4", "--eval-every", str(steps), "--checkpoint-every", "0"]
    args += ["--seed", str(seed), "--rollout-engine", engine, "--output-dir", str(out), *COMMON]
    assert gspo(args) == 0
    seconds = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    evals = [r["eval/greedy_accuracy"] for r in records if "eval/greedy_accuracy" in r]
    steps_ = [r for r in records if "time/weight_sync_s" in r]
    return {
        "engine": engine,
        "seed": seed,
        "reward_first25": statistics.mean(rewards[:25]),
        "reward_last50": statistics.mean(rewards[-50:]),
        "greedy_start": evals[0],
        "greedy_end": evals[-1],
        "seconds": seconds,
        "rollout_s": statistics.mean(r["time/rollout_s"] for r in steps_),
        "sync_s": statistics.mean(r["time/weight_sync_s"] for r in steps_),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--output", "--out", default=None, help=OUT_HELP)
    args = p.parse_args(argv)
    if args.output is None:  # never overwrite committed results
        args.output = str(dated_result("engines_learning"))
    work = Path(tempfile.mkdtemp(prefix="gspo-engines-learning-"))
    sft = work / "sft"
    sft_args = ["sft", "--task", "addition", *SHAPE, "--steps", "400", "--max-new-tokens", "6"]
    assert gspo([*sft_args, "--seed", "2", "--output-dir", str(sft), *COMMON]) == 0
    rows = [
        run(work, sft, engine, int(seed), args.steps)
        for seed in args.seeds.split(",")
        for engine in ("torch", "vllm")
    ]
    print(
        "\n| engine | seed | train reward: steps 1-25 -> last 50 | held-out greedy: start -> end |"
    )
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['seed']} | {r['reward_first25']:.3f} -> "
            f"{r['reward_last50']:.3f} | {r['greedy_start']:.3f} -> {r['greedy_end']:.3f} |"
        )
    for engine in ("torch", "vllm"):
        mine = [r for r in rows if r["engine"] == engine]
        gain = statistics.mean(r["reward_last50"] - r["reward_first25"] for r in mine)
        end = statistics.mean(r["greedy_end"] for r in mine)
        print(f"{engine}: mean reward gain {gain:+.3f}, mean final held-out greedy {end:.3f}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"JSON: {args.output}")


if __name__ == "__main__":
    main()
