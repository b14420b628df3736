"""GSPO vs GRPO on a tiny Mixture-of-Experts policy: routing volatility and Routing Replay.

The GSPO paper (§5.3) reports that after one gradient step ~10% of the experts a token activates
change (48-layer Qwen3-30B-A3B), that GRPO's token-level ratios need Routing Replay to converge on
MoE models, and that GSPO does not. This script runs that comparison at CPU scale:

    variants: grpo, grpo + Routing Replay (R2), gspo, luspo    x    seeds (default 0, 1, 2)

Every variant of a seed starts from the same cold-start SFT checkpoint (made once per seed), sees
the same prompts in the same order (the trainer's data order depends on the seed only) and gets
the same budget (steps x prompts x samples, 4 minibatches per rollout). Each algorithm keeps its
paper clip range (GRPO 0.2 / 0.27, GSPO 3e-4 / 4e-4, LUSPO 2e-3 / 2.5e-3). Old log-probs come
from a recompute pass for every variant, since R2 replays that pass's routing; so the only
difference between ``grpo`` and ``grpo+R2`` is the replay.

Reported per run: train reward and held-out accuracy curves, ``moe/routing_change`` (share of
expert selections of the scored response positions that one RL step's updates changed),
``moe/routing_change_loss`` (the same, as seen by the loss's forwards: 0 under replay),
``clip/fraction``, and collapse:

    collapse: the mean train reward of the last ``window`` steps is below half of the best
    ``window``-step moving average of the run (the reward fell and had not recovered by the end).

Outputs: ``<results>/moe_stability.json`` (config, definitions, every curve, the summary),
``<results>/moe_stability.png`` and a Markdown table on stdout. About 15 minutes on 2 CPU cores
with the defaults; ``--quick`` is a one-minute smoke run of the whole pipeline.

    python experiments/moe_stability.py                  # the full experiment
    python experiments/moe_stability.py --quick          # pipeline check
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gspo.core.comparison import compare_paired

VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {"algo": "grpo"},
    "grpo+R2": {"algo": "grpo", "routing_replay": "old"},
    "gspo": {"algo": "gspo"},
    "luspo": {"algo": "luspo"},
}
"""Variant name -> the TrainConfig fields that differ from the shared ones."""

CURVES = (
    "reward/mean",
    "moe/routing_change",
    "moe/routing_change_any",
    "moe/routing_change_token",
    "moe/routing_change_loss",
    "moe/load_max_share",
    "moe/aux_loss",
    "clip/fraction",
    "clip/fraction_off_policy",
    "ratio/max",
    "kl/old_new",
    "grad_norm",
    "response_length/mean",
)
EVAL_CURVES = ("eval/greedy_accuracy", "eval/pass@1")
COMPARED = {
    "final_greedy": "final held-out greedy accuracy",
    "final_pass@1": "final held-out pass@1",
    "reward_last": "train reward of the last window",
}
"""Per-run summary key -> what the paired comparisons print it as."""


def moe_shape(args: argparse.Namespace) -> dict[str, Any]:
    """Model fields shared by the SFT and RL configs."""
    return dict(
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=4,
        num_kv_heads=2,
        num_experts=args.num_experts,
        experts_top_k=args.top_k,
    )


def cold_start(args: argparse.Namespace, seed: int, out: Path) -> tuple[Path, dict[str, float]]:
    """One supervised cold start per seed, shared by every variant of that seed."""
    from gspo.compose.sft import run_sft
    from gspo.config import SFTConfig, build

    cfg = build(
        SFTConfig,
        overrides=dict(
            model="tiny-moe",
            **moe_shape(args),
            task=args.task,
            seed=seed,
            device="cpu",
            threads=args.threads,
            steps=args.sft_steps,
            n_test=args.n_test,
            max_new_tokens=args.max_new_tokens,
            output_dir=str(out / "sft" / f"seed{seed}"),
            progress=False,
        ),
    )
    result = run_sft(cfg)
    return result.output_dir, result.eval


def rl_run(
    args: argparse.Namespace, variant: str, seed: int, model_dir: Path, out: Path
) -> list[dict[str, Any]]:
    from gspo.compose.train import train
    from gspo.config import TrainConfig, build

    cfg = build(
        TrainConfig,
        overrides=dict(
            model=str(model_dir),
            task=args.task,
            seed=seed,
            device="cpu",
            threads=args.threads,
            steps=args.steps,
            prompts_per_step=args.prompts,
            group_size=args.group_size,
            max_new_tokens=args.max_new_tokens,
            num_minibatches=4,
            lr=args.lr,
            old_logprobs="recompute",
            eval_every=args.eval_every,
            n_test=args.n_test,
            checkpoint_every=0,
            progress=False,
            output_dir=str(out / "runs" / f"{variant}-seed{seed}"),
            **VARIANTS[variant],
        ),
    )
    return train(cfg).history


def moving_average(xs: list[float], window: int) -> list[float]:
    """Trailing moving average (shorter windows at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def collapse(rewards: list[float], window: int) -> dict[str, Any]:
    """Whether the run collapsed (see the module docstring), with the numbers behind it."""
    smooth = moving_average(rewards, window)
    peak = max(smooth[window - 1 :] or smooth)
    final = sum(rewards[-window:]) / len(rewards[-window:])
    return {"collapsed": final < 0.5 * peak, "peak": peak, "final": final}


def summarize_run(history: list[dict[str, Any]], window: int) -> dict[str, Any]:
    steps = [r for r in history if "reward/mean" in r]
    evals = [r for r in history if "eval/greedy_accuracy" in r]
    curves = {k: [r.get(k, math.nan) for r in steps] for k in CURVES}
    curves["step"] = [r["step"] for r in steps]
    eval_curves = {k: [r[k] for r in evals] for k in EVAL_CURVES}
    eval_curves["step"] = [r["step"] for r in evals]

    def mean(key: str) -> float:
        vals = [v for v in curves[key] if not math.isnan(v)]
        return sum(vals) / len(vals) if vals else math.nan

    return {
        "curves": curves,
        "eval_curves": eval_curves,
        "final_greedy": eval_curves["eval/greedy_accuracy"][-1],
        "final_pass@1": eval_curves["eval/pass@1"][-1],
        "start_greedy": eval_curves["eval/greedy_accuracy"][0],
        "start_pass@1": eval_curves["eval/pass@1"][0],
        "reward_first": sum(curves["reward/mean"][:window]) / window,
        "reward_last": sum(curves["reward/mean"][-window:]) / window,
        "routing_change": mean("moe/routing_change"),
        "routing_change_token": mean("moe/routing_change_token"),
        "routing_change_loss": mean("moe/routing_change_loss"),
        "clip_fraction": mean("clip/fraction"),
        "clip_fraction_off_policy": mean("clip/fraction_off_policy"),
        "ratio_max": max(v for v in curves["ratio/max"] if not math.isnan(v)),
        **collapse(curves["reward/mean"], window),
    }


def mean_sd(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def band(per_seed: list[list[float]]) -> tuple[list[float], list[float]]:
    """Mean and standard error across seeds at each step of equal-length curves."""
    columns = list(zip(*per_seed, strict=True))  # [steps][seeds]
    mean = [statistics.fmean(c) for c in columns]
    se = [statistics.stdev(c) / math.sqrt(len(c)) if len(c) > 1 else 0.0 for c in columns]
    return mean, se


def markdown_table(summary: dict[str, dict[str, Any]]) -> str:
    cols = [
        ("held-out greedy: start → end", "start_greedy", "final_greedy", 2),
        ("held-out pass@1: start → end", "start_pass@1", "final_pass@1", 2),
        ("train reward: first → last", "reward_first", "reward_last", 2),
    ]
    head = ["variant", *[c[0] for c in cols]]
    head += ["routing change / step", "routing change seen by loss", "clip fraction", "collapsed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summary.items():
        row = [name]
        for _, a, b, d in cols:
            (ma, sa), (mb, sb) = s[a], s[b]
            row.append(f"{ma:.{d}f} ± {sa:.{d}f} → {mb:.{d}f} ± {sb:.{d}f}")
        for key in ("routing_change", "routing_change_loss", "clip_fraction"):
            m, sd = s[key]
            row.append(f"{100 * m:.2f}% ± {100 * sd:.2f}")
        row.append(f"{s['collapsed']}/{s['runs']}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, dict[str, Any]]], path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    panels = [
        ("curves", "reward/mean", f"train reward ({window}-step moving avg)", True),
        ("eval_curves", "eval/greedy_accuracy", "held-out greedy accuracy", False),
        ("eval_curves", "eval/pass@1", "held-out pass@1 (sampled)", False),
        ("curves", "moe/routing_change", "routing change per step (own router)", True),
        ("curves", "moe/routing_change_loss", "routing change seen by the loss", True),
        ("curves", "clip/fraction", "clipped token fraction", True),
    ]
    colors = dict(zip(runs, ["tab:red", "tab:orange", "tab:blue", "tab:green"], strict=False))
    for ax, (kind, key, title, smooth) in zip(axes.flat, panels, strict=True):
        for name, by_seed in runs.items():
            # Mean over seeds with a band of +- one standard error (seeds share step grids).
            per_seed = [
                moving_average(r[kind][key], window) if smooth else r[kind][key]
                for r in by_seed.values()
            ]  # [seeds][steps]
            xs = next(iter(by_seed.values()))[kind]["step"]
            mean, se = band(per_seed)
            ax.plot(xs, mean, color=colors[name], lw=1.5, label=f"{name} ({len(per_seed)} seeds)")
            low = [m - e for m, e in zip(mean, se, strict=True)]
            high = [m + e for m, e in zip(mean, se, strict=True)]
            ax.fill_between(xs, low, high, color=colors[name], alpha=0.2, linewidth=0)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if "routing" in key or "clip" in key:
            ax.set_yscale("symlog", linthresh=1e-3)
    axes.flat[0].legend()
    fig.suptitle(
        "tiny MoE policy: GRPO vs GRPO + Routing Replay (R2) vs GSPO vs LUSPO "
        "(mean over seeds, band = ± 1 s.e.)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def combine(args: argparse.Namespace) -> None:
    """One result from several calls that ran other seeds with the same settings."""
    saved = [json.loads(Path(f).read_text()) for f in args.combine]
    keep = ("seeds", "command", "combine", "results", "stem", "work_dir", "threads")
    settings = [{k: v for k, v in s["args"].items() if k not in keep} for s in saved]
    if any(x != settings[0] for x in settings):
        raise SystemExit("moe_stability.py: --combine: the files were run with other settings")
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    sft_eval: dict[int, dict[str, float]] = {}
    for s in saved:
        for variant, by_seed in s["runs"].items():
            runs.setdefault(variant, {}).update({int(k): v for k, v in by_seed.items()})
        sft_eval.update({int(k): v for k, v in s["sft_eval"].items()})
    merged = argparse.Namespace(**{**saved[0]["args"], "command": args.command})
    merged.seeds = sorted(sft_eval)
    merged.stem, merged.results = args.stem, args.results
    merged.combined_from = [s["command"] for s in saved]
    results = Path(args.results)
    finish(merged, runs, sft_eval, sum(s["seconds"] for s in saved), results, final=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--task", default="reversal")
    p.add_argument("--sft-steps", type=int, default=100)
    p.add_argument("--steps", type=int, default=120, help="RL steps per run")
    p.add_argument("--prompts", type=int, default=16, help="prompts per RL step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--n-test", type=int, default=100)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--window", type=int, default=10, help="steps of the collapse/summary window")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work-dir", default="runs/moe_stability", help="SFT and run folders")
    p.add_argument("--results", default="experiments/results", help="JSON + PNG go here")
    p.add_argument("--stem", default="moe_stability", help="name of the JSON and PNG files")
    p.add_argument("--replot", metavar="JSON", help="redraw the PNG of a finished run's JSON")
    p.add_argument(
        "--combine",
        nargs="+",
        metavar="JSON",
        help="merge runs of the same settings made by several calls (other seeds) into "
        "<results>/<stem>.json and .png",
    )
    p.add_argument("--quick", action="store_true", help="tiny budget: checks the pipeline only")
    args = p.parse_args(argv)
    args.command = "python experiments/moe_stability.py " + " ".join(argv or sys.argv[1:])
    if args.combine:
        combine(args)
        return
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        png = Path(args.replot).with_suffix(".png")
        plot(saved["runs"], png, saved["args"]["window"])
        print(f"wrote {png}")
        return
    if args.quick:
        args.seeds, args.sft_steps, args.steps, args.eval_every = [0], 5, 6, 3
        args.prompts, args.n_test, args.window = 4, 8, 2
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.work_dir)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs: dict[str, dict[int, dict[str, Any]]] = {v: {} for v in args.variants}
    sft_eval: dict[int, dict[str, float]] = {}
    for seed in args.seeds:
        t = time.perf_counter()
        model_dir, sft_eval[seed] = cold_start(args, seed, out)
        print(
            f"seed {seed}: cold start {time.perf_counter() - t:.0f}s, held-out greedy "
            f"{sft_eval[seed]['greedy_accuracy']:.2f}, pass@1 {sft_eval[seed]['pass@1']:.2f}",
            flush=True,
        )
        for variant in args.variants:
            t = time.perf_counter()
            history = rl_run(args, variant, seed, model_dir, out)
            r = summarize_run(history, args.window)
            r["seconds"] = time.perf_counter() - t
            runs[variant][seed] = r
            print(
                f"  {variant:8s} {r['seconds']:5.0f}s  greedy {r['start_greedy']:.2f}->"
                f"{r['final_greedy']:.2f}  reward {r['reward_first']:.2f}->{r['reward_last']:.2f}"
                f"  routing change {100 * r['routing_change']:.2f}%  (loss "
                f"{100 * r['routing_change_loss']:.2f}%)  clip {100 * r['clip_fraction']:.2f}%"
                f"  collapsed {r['collapsed']}",
                flush=True,
            )
        finish(args, runs, sft_eval, time.perf_counter() - t0, results, final=False)
    finish(args, runs, sft_eval, time.perf_counter() - t0, results, final=True)


def finish(
    args: argparse.Namespace,
    runs: dict[str, dict[int, dict[str, Any]]],
    sft_eval: dict[int, dict[str, float]],
    elapsed: float,
    results: Path,
    *,
    final: bool,
) -> None:
    """Summary, paired comparisons and the JSON over the seeds finished so far (written after
    every seed, so a stopped run keeps its seeds); the plot and the tables once ``final``."""
    runs = {v: by_seed for v, by_seed in runs.items() if by_seed}
    summary: dict[str, dict[str, Any]] = {}
    for variant, by_seed in runs.items():
        rs = list(by_seed.values())
        summary[variant] = {
            key: mean_sd([r[key] for r in rs])
            for key in (
                "start_greedy",
                "final_greedy",
                "start_pass@1",
                "final_pass@1",
                "reward_first",
                "reward_last",
                "routing_change",
                "routing_change_token",
                "routing_change_loss",
                "clip_fraction",
                "clip_fraction_off_policy",
            )
        }
        summary[variant]["collapsed"] = sum(r["collapsed"] for r in rs)
        summary[variant]["runs"] = len(rs)
    # DESIGN.md, "How learning is compared": paired by seed, interval, MDE and verdict.
    pairs = [("grpo", "grpo+R2"), ("gspo", "grpo"), ("gspo", "grpo+R2"), ("luspo", "gspo")]
    comparisons = {
        metric: [
            compare_paired(
                {int(s): r[metric] for s, r in runs[a].items()},
                {int(s): r[metric] for s, r in runs[b].items()},
                names=(a, b),
                problems=args.n_test if metric != "reward_last" else None,
                shared_baseline=sum(b in pr for pr in pairs if pr[0] in runs and pr[1] in runs),
            )
            for a, b in pairs
            if a in runs and b in runs
        ]
        for metric in COMPARED
    }
    stem = f"{args.stem}_quick" if args.quick else args.stem
    payload = {
        "command": args.command,
        "args": vars(args),
        "seconds": elapsed,
        "definitions": {
            "routing_change": "share of (scored response position, MoE layer, top-k slot) "
            "selections of the updated policy's own router whose expert is not among the "
            "pre-update policy's k experts there, measured on the step's rollout after its "
            "num_minibatches updates; mean over steps",
            "routing_change_loss": "the same share for the routing the loss's forwards used "
            "(0 under Routing Replay); token-weighted over a step's minibatches",
            "clip_fraction": "share of response tokens whose gradient clipping zeroed",
            "collapsed": f"mean train reward of the last {args.window} steps < 0.5 x the best "
            f"{args.window}-step moving average of the run",
        },
        "sft_eval": sft_eval,
        "summary": summary,
        "comparisons": {m: [c.to_json() for c in cs] for m, cs in comparisons.items()},
        "runs": runs,
    }
    (results / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    if not final:
        return
    plot(runs, results / f"{stem}.png", args.window)
    print()
    print(
        f"tiny MoE (d{args.hidden_size}, {args.num_layers} layers, {args.num_experts} experts, "
        f"top-{args.top_k}), task {args.task}, {args.steps} RL steps x {args.prompts} prompts x "
        f"{args.group_size} samples, lr {args.lr}, seeds {args.seeds}; mean ± sd over seeds; "
        f"{elapsed / 60:.1f} min"
    )
    print()
    print(markdown_table(summary))
    for metric, cs in comparisons.items():
        print(f"\n{COMPARED[metric]}, paired by seed (gspo.core.comparison):")
        for c in cs:
            print("  " + c.line())
    print(f"\nwrote {results / f'{stem}.json'} and {results / f'{stem}.png'}")


if __name__ == "__main__":
    main()
