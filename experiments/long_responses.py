"""GSPO vs GRPO vs GSPO-token where token-ratio noise has something to act on ([GSPO] §5.2):
responses of 256 tokens, 8 minibatches per rollout and a bf16 engine beside a float32 trainer.

The paper attributes GRPO's instability to token-level importance ratios whose noise
"accumulates over long sequences" and grows with off-policy minibatches and engine/trainer
precision mismatch. ``experiments/ratio_noise.py`` measures that noise on its own; this script
trains through it.

Task ``chain`` (made here, passed to the trainer as ``long_responses:chain_task``): the
scratchpad task's last-digit chain at ``--ops`` operations (default 128). The prompt is the
chain ("3*7+4*3+8...=", 2 x ops + 2 characters), the response every intermediate digit,
comma-separated ("1,5,5,3,...": 2 x ops - 1 characters, so 255 tokens and the end token at 128
operations). The reward is dense: the share of the ``ops`` steps whose digit is right given the
digit the response wrote before it (a local check, so one slip costs one step, not the rest of
the chain); a response with more steps than the chain is scored over its own length. A tiny
model learns each step as one look-up at a fixed offset, so a short cold start leaves it
partly right (reward ~0.5-0.8 per step) and RL has room to improve it.

Per seed: one cold start (SFT of a float32 tiny Qwen3 built with room for the positions), then
one RL run per variant from it with the same prompts in the same order: ``--prompts`` x
``--group-size`` samples, ``--minibatches`` optimizer steps per rollout, the engine in
``--engine-dtype`` and its log-probs used as the old log-probs (the mismatch reaches the ratio),
each algorithm at its paper clip range. Reported per run: the train-reward curve, clip
fraction, the largest ratio, and collapse (``moe_stability.collapse``: the last window's mean
reward below half the best window's). Paired by seed (``gspo.core.comparison``): train reward
of the last window and over the whole run.

    python experiments/long_responses.py --quick          # pipeline check, ~3 minutes
    python experiments/long_responses.py --seeds 0-9      # the experiment

Outputs: ``<results>/<stem>.json`` (config, every curve, the summary, the comparisons) and
``<stem>.png`` (mean train reward per variant with a +-1 s.e. band over seeds).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from moe_stability import band, collapse, mean_sd

from gspo.core.comparison import compare_paired
from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.scratchpad import ADDENDS, MULTIPLIERS, run_chain

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {"algo": "grpo"},
    "gspo": {"algo": "gspo"},
    "gspo-token": {"algo": "gspo_token"},
}
"""Variant name -> the TrainConfig fields that differ from the shared ones."""
CURVES = ("reward/mean", "clip/fraction", "ratio/max", "kl/old_new", "grad_norm")
DEFAULT_OPS = 86


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------


def sample_chain(rng: random.Random, ops_count: int) -> Example:
    start = rng.randint(0, 9)
    ops = [
        ("+", rng.choice(ADDENDS)) if rng.random() < 0.5 else ("*", rng.choice(MULTIPLIERS))
        for _ in range(ops_count)
    ]
    digits = run_chain(start, ops)
    prompt = str(start) + "".join(f"|{op}{d}" for op, d in ops) + "="  # 3 characters an op
    return Example(
        prompt=prompt,
        answer=str(digits[-1]),
        demo="".join(f"{op}{d}{v}" for (op, d), v in zip(ops, digits, strict=True)),
        meta={"start": start, "ops": ops},
    )


def chain_reward(completion: str, example: Example) -> float:
    """Share of the response's characters that are right: each step's operation and operand
    against the prompt, its digit against the step applied to the digit the response wrote
    before it (a local check: one slip costs one character, not the rest of the chain). Scored
    over the chain's length or the response's, whichever is longer."""
    ops = example.meta["ops"]
    text = completion.strip()
    steps = [text[i : i + 3] for i in range(0, len(text), 3)]
    prev, right = example.meta["start"], 0
    for step, (op, operand) in zip(steps, ops, strict=False):
        want = (prev + operand) % 10 if op == "+" else (prev * operand) % 10
        right += sum(a == b for a, b in zip(step, f"{op}{operand}{want}", strict=False))
        prev = int(step[2]) if len(step) == 3 and step[2].isdigit() else want
    return right / (3 * max(len(ops), len(steps)))


def chain_task(*, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None) -> Task:
    """The ``chain`` task; ``difficulty`` = operations (default 128)."""
    ops_count = DEFAULT_OPS if difficulty is None else difficulty

    def draw(split: str, n: int) -> list[Example]:
        rng = random.Random(f"chain/{ops_count}/{seed}/{split}")  # 18^128 chains: no overlap
        return [sample_chain(rng, ops_count) for _ in range(n)]

    return Task(
        name="chain",
        train=draw("train", n_train),
        test=draw("test", n_test),
        reward=chain_reward,
        description=f"last-digit chain of {ops_count} operations, every digit written",
    )


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def init_model(args: argparse.Namespace, out: Path) -> Path:
    """A float32 tiny Qwen3 with positions for prompt + response, saved once for every seed's
    cold start (the SFT run seeds its own data order; the weights differ by seed below)."""
    from gspo.models.char_tokenizer import build_char_tokenizer
    from gspo.models.model_io import save_model
    from gspo.models.tiny_model import build_tiny_model

    path = out / "init"
    if not (path / "config.json").exists():
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(
            len(tokenizer),
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            max_position_embeddings=6 * args.ops + 32,
            seed=0,
        )
        save_model(model, tokenizer, path)
    return path


def cold_start(args: argparse.Namespace, init: Path, out: Path) -> Path:
    """One cold start (seed 0) shared by every seed and variant: at ~1 s an SFT step on 2 cores,
    a cold start per seed would cost more than the RL runs."""
    from gspo.compose.sft import run_sft
    from gspo.config import SFTConfig, build

    done = out / "sft"
    if (done / "config.json").exists():
        return done
    cfg = build(
        SFTConfig,
        overrides=dict(
            model=str(init),
            task="long_responses:chain_task",
            difficulty=args.ops,
            seed=0,
            device="cpu",
            threads=args.threads,
            steps=args.sft_steps,
            lr=args.sft_lr,
            batch_size=args.sft_batch,
            n_test=20,
            max_new_tokens=3 * args.ops + 8,
            output_dir=str(done),
            progress=False,
        ),
    )
    return run_sft(cfg).output_dir


def rl_run(args: argparse.Namespace, variant: str, seed: int, model: Path, out: Path) -> list:
    """One RL run's history; a finished run in ``out`` is read back instead of run again."""
    from gspo.compose.train import train
    from gspo.config import TrainConfig, build

    folder = out / "runs" / f"{variant}-seed{seed}"
    if (folder / "final").is_dir():
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    cfg = build(
        TrainConfig,
        overrides=dict(
            model=str(model),
            task="long_responses:chain_task",
            difficulty=args.ops,
            seed=seed,
            device="cpu",
            threads=args.threads,
            steps=args.steps,
            prompts_per_step=args.prompts,
            group_size=args.group_size,
            max_new_tokens=3 * args.ops + 8,
            num_minibatches=args.minibatches,
            engine_dtype=args.engine_dtype,
            lr=args.lr,
            eval_every=0,
            n_test=args.n_test,
            checkpoint_every=0,
            progress=False,
            output_dir=str(folder),
            **VARIANTS[variant],
        ),
    )
    return train(cfg).history


def summarize_run(history: list[dict[str, Any]], window: int) -> dict[str, Any]:
    steps = [r for r in history if "reward/mean" in r]
    curves = {k: [r.get(k, float("nan")) for r in steps] for k in CURVES}
    curves["response_length/mean"] = [r.get("response_length/mean") for r in steps]
    rewards = curves["reward/mean"]
    return {
        "curves": curves,
        "reward_first": sum(rewards[:window]) / window,
        "reward_last": sum(rewards[-window:]) / window,
        "reward_run": sum(rewards) / len(rewards),
        "clip_fraction": sum(curves["clip/fraction"]) / len(rewards),
        "ratio_max": max(curves["ratio/max"]),
        **collapse(rewards, window),
    }


def report(runs: dict[str, dict[int, dict[str, Any]]], stem: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    print(
        "| variant | seeds | train reward: first → last window | whole run | clip fraction | largest ratio | collapsed |"
    )
    print("|---|---|---|---|---|---|---|")
    for variant, by_seed in runs.items():
        rows = list(by_seed.values())
        first, last, whole = (
            mean_sd([r[k] for r in rows]) for k in ("reward_first", "reward_last", "reward_run")
        )
        clip = mean_sd([r["clip_fraction"] for r in rows])[0]
        ratio = max(r["ratio_max"] for r in rows)
        down = sum(r["collapsed"] for r in rows)
        summary[variant] = {
            "seeds": len(rows),
            "reward_first": first,
            "reward_last": last,
            "reward_run": whole,
            "clip_fraction": clip,
            "ratio_max": ratio,
            "collapsed": down,
        }
        print(
            f"| {variant} | {len(rows)} | {first[0]:.3f} → {last[0]:.3f} ± {last[1]:.3f} | "
            f"{whole[0]:.3f} ± {whole[1]:.3f} | {clip:.3f} | {ratio:.3g} | {down}/{len(rows)} |"
        )
    comparisons = {}
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            seeds = sorted(set(runs[a]) & set(runs[b]))
            for key in ("reward_last", "reward_run"):
                res = compare_paired(
                    {s: runs[a][s][key] for s in seeds},
                    {s: runs[b][s][key] for s in seeds},
                    names=(a, b),
                )
                comparisons[f"{a} - {b}: {key}"] = res.to_json()
                print(f"{key}: {res.line()}")
    return {"summary": summary, "comparisons": comparisons}


def plot(runs: dict[str, dict[int, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for variant, by_seed in runs.items():
        for axis, key in zip(ax, ("reward/mean", "clip/fraction"), strict=True):
            per_seed = [r["curves"][key] for r in by_seed.values()]
            mean, se = band(per_seed)
            xs = list(range(1, len(mean) + 1))
            axis.plot(xs, mean, label=f"{variant} ({len(per_seed)} seeds)")
            axis.fill_between(
                xs,
                [m - e for m, e in zip(mean, se, strict=True)],
                [m + e for m, e in zip(mean, se, strict=True)],
                alpha=0.2,
            )
            axis.set_xlabel("RL step")
            axis.set_ylabel(key)
    ax[0].legend()
    fig.suptitle("chain task, 258-token responses, 8 minibatches, bf16 engine (mean ± 1 s.e.)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--ops", type=int, default=DEFAULT_OPS, help="operations per chain (3 tokens each)"
    )
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--sft-batch", type=int, default=32)
    p.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,3,5")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--minibatches", type=int, default=8)
    p.add_argument("--engine-dtype", default="bfloat16")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--window", type=int, default=5)
    p.add_argument("--n-test", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/long_responses", help="working folder (models, runs)")
    p.add_argument("--stem", default="long_responses", help="results file name without suffix")
    p.add_argument("--combine", nargs="*", help="merge these results JSON files (no runs)")
    p.add_argument("--quick", action="store_true", help="2 seeds x 3 steps: a pipeline check")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the trainer imports the task
    if args.quick:
        args.seeds, args.steps, args.sft_steps, args.window = "0,1", 3, 20, 1
    if args.combine:
        runs: dict[str, dict[int, Any]] = {}
        config = None
        for path in args.combine:
            data = json.loads(Path(path).read_text())
            config = config or data["config"]
            for variant, by_seed in data["runs"].items():
                runs.setdefault(variant, {}).update({int(s): r for s, r in by_seed.items()})
        seeds = sorted({s for by_seed in runs.values() for s in by_seed})
        config = {**config, "seeds": ",".join(map(str, seeds)), "stem": args.stem}
    else:
        config = {k: v for k, v in vars(args).items() if k not in ("combine", "out")}
        out = Path(args.out)
        model = cold_start(args, init_model(args, out), out)
        runs = {}
        for seed in parse_seeds(args.seeds):
            for variant in args.variants.split(","):
                t0 = time.perf_counter()
                history = rl_run(args, variant, seed, model, out)
                runs.setdefault(variant, {})[seed] = summarize_run(history, args.window)
                print(
                    f"seed {seed} {variant}: reward {runs[variant][seed]['reward_first']:.3f} → "
                    f"{runs[variant][seed]['reward_last']:.3f} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"config": config, "runs": runs, **report(runs, RESULTS)}
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=1, default=str))
    plot(runs, RESULTS / f"{args.stem}.png")
    print(f"wrote {RESULTS / args.stem}.json and .png")


if __name__ == "__main__":
    main()
