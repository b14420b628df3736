"""Soak check: a long CPU run with injected reward failures and a SIGKILL every few seconds,
resumed automatically; then the same run unbroken, and a comparison.

    python scripts/soak.py --steps 300 --kill-every 20 --out runs/soak

Reports steps completed, kills survived, reward faults injected (and counted by the trainer),
and whether anything was lost: the killed-and-resumed run's metrics and final weights must
equal the unbroken run's. Writes ``soak.json`` in the output folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

TIMING = ("time/", "throughput/")


def flaky(reward, rate: float):
    """Wrap a reward so that a deterministic share of (prompt, completion) pairs raise."""

    def wrapped(text, example):
        digest = hashlib.blake2b(f"{example.prompt}\x00{text}".encode(), digest_size=4).digest()
        if int.from_bytes(digest, "big") / 2**32 < rate:
            raise RuntimeError("injected reward failure")
        return reward(text, example)

    return wrapped


def child(args: argparse.Namespace) -> int:
    """One life of the run: resume if a checkpoint exists, train until done or killed."""
    from transformers.utils import logging as hf_logging

    import gspo.compose.train as trainer_module
    from gspo.config import TrainConfig, build
    from gspo.core.checkpoint_paths import latest_checkpoint

    hf_logging.disable_progress_bar()
    real_build_task = trainer_module.build_task

    def build_task(cfg):
        task = real_build_task(cfg)
        task.reward = flaky(task.reward, args.fault_rate)
        return task

    trainer_module.build_task = build_task
    cfg = build(
        TrainConfig,
        preset="demo",
        overrides=dict(
            model=args.model,
            output_dir=args.run_dir,
            steps=args.steps,
            checkpoint_every=args.checkpoint_every,
            eval_every=0,
            device="cpu",
            threads=1,
            progress=False,
        ),
    )
    trainer_module.train(cfg, resume=latest_checkpoint(args.run_dir) is not None)
    return 0


def launch(args: argparse.Namespace, run_dir: Path) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--child", "--run-dir", str(run_dir), "--model", args.model]
    cmd += ["--steps", str(args.steps), "--checkpoint-every", str(args.checkpoint_every)]
    cmd += ["--fault-rate", str(args.fault_rate)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)


def records(run_dir: Path) -> list[dict]:
    rows = [
        json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()
    ]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between kills")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--fault-rate", type=float, default=0.05, help="share of rewards that raise")
    p.add_argument("--out", default="runs/soak")
    p.add_argument("--model", default=None, help="cold-start model dir (default: a fresh SFT)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if args.model is None:
        from gspo.compose.sft import run_sft
        from gspo.config import SFTConfig, build

        print("cold start (SFT) ...", flush=True)
        run_sft(
            build(
                SFTConfig, overrides=dict(output_dir=str(out / "sft"), device="cpu", progress=False)
            )
        )
        args.model = str(out / "sft")

    rng = random.Random(args.seed)
    killed_dir, unbroken_dir = out / "killed", out / "unbroken"
    t0 = time.time()
    kills = lives = 0
    while not (killed_dir / "final" / "model.safetensors").is_file():
        lives += 1
        proc = launch(args, killed_dir)
        try:
            code = proc.wait(timeout=rng.expovariate(1.0 / args.kill_every))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            done = (
                len([r for r in records(killed_dir) if "reward/mean" in r])
                if (killed_dir / "metrics.jsonl").exists()
                else 0
            )
            print(
                f"  kill {kills}: {done} steps on disk after {time.time() - t0:.0f} s", flush=True
            )
            continue
        if code != 0:
            print(f"run failed with exit code {code}", file=sys.stderr)
            return 1
    soak_s = time.time() - t0
    print(f"killed run finished after {kills} kills; running it again unbroken ...", flush=True)
    t1 = time.time()
    if launch(args, unbroken_dir).wait() != 0:
        print("unbroken run failed", file=sys.stderr)
        return 1

    import torch
    from safetensors.torch import load_file

    got, want = records(killed_dir), records(unbroken_dir)
    a = load_file(str(killed_dir / "final" / "model.safetensors"))
    b = load_file(str(unbroken_dir / "final" / "model.safetensors"))
    weights_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [r for r in got if "reward/mean" in r]
    report = {
        "steps_completed": len(steps),
        "kills": kills,
        "lives": lives,
        "reward_faults_counted": int(sum(r["reward/errors"] for r in steps)),
        "samples": len(steps) * 16 * 8,
        "metrics_equal": got == want,
        "weights_equal": weights_equal,
        "nothing_lost": got == want and weights_equal,
        "soak_seconds": round(soak_s, 1),
        "unbroken_seconds": round(time.time() - t1, 1),
    }
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if report["nothing_lost"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
