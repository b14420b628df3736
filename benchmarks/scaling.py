"""Local vs Ray backends on this machine: seconds per step split into rollout, reward, train and
weight sync, tokens/s, and what Ray adds per step.

    python benchmarks/scaling.py                      # tiny model, demo batch (16 x 8), CPU
    python benchmarks/scaling.py --model runs/sft --steps 20

The policy is a short SFT of the tiny model on the addition demo (``--sft-steps``, made first;
or ``--model``), so that rewards differ within groups and every step has a real update (a
random-init model scores 0 everywhere and the local backend then skips the backward).

Runs the real `gspo train` loop (``gspo.compose.train.train``) once per setup, same seed and batch:

- ``local``: one process (the engine shares the model);
- ``ray 1r+0w``: one FSDP2 rank in a Ray actor, the engine in the driver (sync = gather);
- ``ray 1r+1w``: one rank and one rollout worker (sync = gather + object store + load);
- ``ray 2r+1w``: two ranks (gloo) and one rollout worker.

Per step (the first ``--warmup`` steps left out, median over the rest): ``rollout`` (generation),
``reward`` (scoring, timed around the single-turn environment's ``step_batch``; ``rollout`` is
the step's ``time/rollout_s`` less it), ``train`` (update, without the
sync), ``sync`` (weights to the engine), ``step`` (wall time from one step's start to the
next's) and ``tokens/s`` (generated tokens / step). ``start`` is the time from ``train()`` to
the first step (Ray start, actors, model build). The Ray overhead per step is the step time
against ``local``'s. Writes a new dated benchmarks/results/scaling-YYYYMMDD-HHMMSS.json (or
--out) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _results import OUT_HELP, dated_result

SETUPS = {
    "local": dict(backend="local"),
    "ray 1r+0w": dict(backend="ray", trainer_workers=1, rollout_workers=0),
    "ray 1r+1w": dict(backend="ray", trainer_workers=1, rollout_workers=1),
    "ray 2r+1w": dict(backend="ray", trainer_workers=2, rollout_workers=1),
}


def run_setup(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from gspo.compose.train import train
    from gspo.config import TrainConfig, build
    from gspo.envs.base import SingleTurnEnv
    from gspo.orchestration import steps

    overrides = dict(
        output_dir=str(out / name.replace(" ", "_").replace("+", "_")),
        steps=args.steps,
        seed=0,
        device="cpu",
        threads=args.threads,
        model=args.model,
        lr=3e-4,
        eval_every=0,
        checkpoint_every=0,
        progress=False,
        **SETUPS[name],
    )
    cfg = build(TrainConfig, preset="demo", overrides=overrides)
    starts: list[float] = []
    reward_s: list[float] = []
    collect, step_batch = steps.collect, SingleTurnEnv.step_batch

    def timed_collect(parts, state):
        starts.append(time.perf_counter())
        return collect(parts, state)

    def timed_score(env, *args):
        t0 = time.perf_counter()
        try:
            return step_batch(env, *args)
        finally:
            reward_s.append(time.perf_counter() - t0)

    steps.collect, SingleTurnEnv.step_batch = timed_collect, timed_score
    t0 = time.perf_counter()
    try:
        result = train(cfg)
    finally:
        steps.collect, SingleTurnEnv.step_batch = collect, step_batch
    end = time.perf_counter()
    records = [r for r in result.history if "time/train_s" in r]
    walls = [b - a for a, b in zip(starts, [*starts[1:], end], strict=True)]
    keep = slice(args.warmup, None)

    def med(values: list[float]) -> float:
        return statistics.median(values[keep])

    tokens = [
        r["response_length/mean"] * cfg.rollout.prompts_per_step * cfg.rollout.group_size
        for r in records
    ]
    sync = [r["time/weight_sync_s"] for r in records]
    return {
        "setup": name,
        **SETUPS[name],
        "start_s": starts[0] - t0,
        "step_s": med(walls),
        "rollout_s": med([r["time/rollout_s"] - s for r, s in zip(records, reward_s, strict=True)]),
        "reward_s": med(reward_s),
        "train_s": med([r["time/train_s"] - s for r, s in zip(records, sync, strict=True)]),
        "sync_s": med(sync),
        "tokens_per_s": med([t / w for t, w in zip(tokens, walls, strict=True)]),
        "reward_last": statistics.mean(r["reward/mean"] for r in records[-5:]),
    }


def sft(args: argparse.Namespace, out: Path) -> str:
    """A short SFT of the tiny model on the addition demo (the policy every setup starts from)."""
    from gspo.interface.cli import main as gspo

    flags = ["sft", "--task", "addition", "--steps", str(args.sft_steps), "--seed", "1"]
    flags += ["--max-new-tokens", "6", "--device", "cpu", "--threads", str(args.threads)]
    if gspo([*flags, "--progress", "false", "--output-dir", str(out)]) != 0:
        raise RuntimeError("the SFT run failed")
    return str(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default=None, help="policy folder; default: a fresh SFT")
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--setups", default=",".join(SETUPS), help="comma-separated subset")
    p.add_argument("--output", "--out", default=None, help=OUT_HELP)
    args = p.parse_args()
    if args.output is None:  # never overwrite committed results
        args.output = str(dated_result("scaling"))
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gspo-scaling-") as tmp:
        if args.model is None:
            args.model = sft(args, Path(tmp) / "sft")
        for name in args.setups.split(","):
            rows.append(run_setup(name, args, Path(tmp)))
            print(f"{name}: {rows[-1]['step_s']:.3f} s/step", file=sys.stderr, flush=True)
    base = next((r["step_s"] for r in rows if r["setup"] == "local"), None)
    for r in rows:
        r["ray_overhead_s"] = None if base is None else r["step_s"] - base
        r["vs_local"] = None if base is None else r["step_s"] / base
    print(
        "| setup | s/step | rollout | reward | train | sync | tokens/s | x local | Ray overhead "
        "s/step | start s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "" if r["vs_local"] is None else f"{r['vs_local']:.2f}"
        extra = "" if r["ray_overhead_s"] is None else f"{r['ray_overhead_s']:+.3f}"
        print(
            f"| {r['setup']} | {r['step_s']:.3f} | {r['rollout_s']:.3f} | {r['reward_s']:.3f} | "
            f"{r['train_s']:.3f} | {r['sync_s']:.3f} | {r['tokens_per_s']:.0f} | {ratio} | "
            f"{extra} | {r['start_s']:.1f} |"
        )
    machine = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("output", "model")}
    out.write_text(json.dumps({"machine": machine, "settings": settings, "rows": rows}, indent=2))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
