"""Task 1 of issue 21: does RL teach the tiny model to use a calculator better than SFT alone,
and does the tool beat answering in its head?

    nice -n 10 python benchmarks/calculator_tools.py                # the documented run
    nice -n 10 python benchmarks/calculator_tools.py --steps 10 --n-test 50   # a smoke run

1. Cold start: SFT of the tiny char model (seed 0, ``--sft-steps``, batch 64) on the calculator
   task's demonstrations, which contain the tool call and its reply
   (``123*456=`` -> ``[[calc:123*456]] => 56088 56088``). The SFT is kept short on purpose so
   that the cold-started policy still makes mistakes RL can fix.
2. RL from that checkpoint for ``--steps`` steps with GSPO (episode credit), GSPO-token
   (per-turn credit, ``credit=turn``) and GRPO (episode credit), same seed and budget.
3. No-tool baseline: the same SFT budget on the same problems answered in one turn without the
   tool (task ``multiply``), then the same GSPO RL.

Reports held-out greedy accuracy (``--n-test`` problems, with its standard error) of the SFT
checkpoints and of every RL run, turns / tool calls / tool errors per held-out episode, and
per-step training reward and policy tokens per episode (response length over training).
Writes JSON to benchmarks/results/calculator_tools.json and prints a Markdown table.
Everything runs on CPU with one thread.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from gspo.config import SFTConfig, TrainConfig
from gspo.sft import run_sft
from gspo.trainer import train

RESULTS = Path(__file__).resolve().parent / "results"
COMMON = dict(device="cpu", threads=1, progress=False, seed=0)
RUNS = (  # (label, task, algo, credit)
    ("gspo", "calculator", "gspo", "episode"),
    ("gspo_token_turn", "calculator", "gspo_token", "turn"),
    ("grpo", "calculator", "grpo", "episode"),
    ("no_tool_gspo", "multiply", "gspo", "episode"),
)
EVAL_KEYS = ("greedy_accuracy", "greedy_accuracy_se", "turns_mean", "tool_calls_mean",
             "tool_errors", "policy_tokens_mean", "env_tokens_mean")  # fmt: skip


def sft(task: str, steps: int, out: Path) -> float:
    t0 = time.perf_counter()
    run_sft(SFTConfig(task=task, steps=steps, batch_size=64, n_test=0, output_dir=str(out),
                      **COMMON))  # fmt: skip
    return time.perf_counter() - t0


def rl(model: Path, task: str, algo: str, credit: str, args, out: Path) -> dict:
    t0 = time.perf_counter()
    cfg = TrainConfig(
        model=str(model), task=task, algo=algo, credit=credit, steps=args.steps,
        prompts_per_step=args.prompts, group_size=args.group, lr=args.lr,
        max_new_tokens=24, max_total_tokens=64, n_test=args.n_test,
        eval_every=args.steps, checkpoint_every=0, output_dir=str(out), **COMMON,
    )  # fmt: skip
    result = train(cfg)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/greedy_accuracy" in r]
    steps = [r for r in records if "reward/mean" in r]
    length = "episode/policy_tokens_mean" if task == "calculator" else "response_length/mean"

    def pick(r: dict) -> dict:
        return {k: r[f"eval/{k}"] for k in EVAL_KEYS if f"eval/{k}" in r}

    return {
        "task": task,
        "algo": algo,
        "credit": credit,
        "start": pick(evals[0]),
        "end": pick(evals[-1]),
        "train_reward": [round(r["reward/mean"], 4) for r in steps],
        "policy_tokens": [round(r[length], 2) for r in steps],
        "tool_calls": [round(r.get("episode/tool_calls_mean", 0.0), 3) for r in steps],
        "seconds": round(time.perf_counter() - t0, 1),
        "final_eval_matches": result.final_eval.get("eval/greedy_accuracy")
        == evals[-1]["eval/greedy_accuracy"],
    }


def _acc(e: dict) -> str:
    return f"{e['greedy_accuracy']:.3f} ± {e['greedy_accuracy_se']:.3f}"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sft-steps", type=int, default=120)
    p.add_argument("--steps", type=int, default=40, help="RL steps per run")
    p.add_argument("--prompts", type=int, default=8, help="prompts per RL step")
    p.add_argument("--group", type=int, default=4, help="episodes per prompt")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--n-test", type=int, default=200)
    p.add_argument("--output", default=str(RESULTS / "calculator_tools.json"))
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gspo-calc-"))
    t0 = time.perf_counter()
    sft_s = {task: sft(task, args.sft_steps, work / f"sft-{task}") for task in
             ("calculator", "multiply")}  # fmt: skip
    runs = {}
    for label, task, algo, credit in RUNS:
        runs[label] = rl(work / f"sft-{task}", task, algo, credit, args, work / label)
        print(f"{label}: {_acc(runs[label]['start'])} -> {_acc(runs[label]['end'])} "
              f"({runs[label]['seconds']} s)", flush=True)  # fmt: skip
    report = {"args": vars(args), "sft_seconds": sft_s, "runs": runs,
              "total_seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    print("\n| run | held-out greedy: SFT -> after RL | turns | tool calls | tool errors "
          "| policy tokens: first 5 -> last 5 steps |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for label, r in runs.items():
        e, toks = r["end"], r["policy_tokens"]
        first, last = sum(toks[:5]) / len(toks[:5]), sum(toks[-5:]) / len(toks[-5:])
        print(f"| {label} | {_acc(r['start'])} -> {_acc(e)} | {e.get('turns_mean', 1.0):.2f} "
              f"| {e.get('tool_calls_mean', 0.0):.2f} | {e.get('tool_errors', 0.0):.0f} "
              f"| {first:.1f} -> {last:.1f} |")  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nJSON: {args.output} ({report['total_seconds']} s)")
    return report


if __name__ == "__main__":
    main()
