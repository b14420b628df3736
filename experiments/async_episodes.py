"""Async multi-turn episodes learn: the calculator tool task, synchronous (K = 0) vs async K.

    python experiments/async_episodes.py [--ks 0 1] [--rl-steps 25] [--out runs/async_episodes]

The setup of tests/test_envs_learning.py: an SFT cold start of a tiny char model on tool-call
demonstrations, then GSPO-token with per-turn credit from it, once per K (same seed, prompts
and random streams; K >= 1 runs the episodes on the rollout thread,
gspo.orchestration.async_episodes). Prints greedy held-out accuracy (± s.e. over problems) of
the SFT start and of each run, and the async metrics; writes ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from gspo.compose.parts import build_task
from gspo.compose.sft import run_sft
from gspo.compose.train import train
from gspo.config import SFTConfig, TrainConfig
from gspo.envs import env_for
from gspo.envs.episodes import Episodes
from gspo.models.model_io import load_model, load_tokenizer
from gspo.models.policy import build_prompt_format
from gspo.rollout.torch_engine import TorchEngine

SHAPE = dict(hidden_size=128, num_layers=3, seed=0, device="cpu", threads=1)
EPISODE = dict(max_new_tokens=24, max_turns=3, max_total_tokens=64)


def accuracy(path: Path, cfg: TrainConfig) -> dict[str, float]:
    model, tok = load_model(path), load_tokenizer(path)
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    task = build_task(cfg)
    fmt = build_prompt_format(cfg.model, tok, model)
    return Episodes(cfg, env_for(task, cfg, fmt.chat), tok, fmt).evaluate(engine, task.test)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/async_episodes")
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--rl-steps", type=int, default=25)
    ap.add_argument("--n-test", type=int, default=200)
    args = ap.parse_args()
    out = Path(args.out)
    torch.manual_seed(0)
    sft = out / "sft"
    if not (sft / "config.json").exists():
        run_sft(SFTConfig(output_dir=str(sft), task="calculator", steps=args.sft_steps,
                          batch_size=64, n_test=0, progress=False, **SHAPE))  # fmt: skip
    results: dict[str, dict] = {}
    for k in args.ks:
        cfg = TrainConfig.of(
            output_dir=str(out / f"k{k}"), model=str(sft), task="calculator", algo="gspo_token",
            credit="turn", steps=args.rl_steps, prompts_per_step=16, group_size=8, lr=3e-4,
            warmup_steps=2, num_minibatches=2, eval_every=0, checkpoint_every=0,
            progress=False, n_train=2000, n_test=args.n_test, max_staleness=k,
            **EPISODE, **SHAPE,
        )  # fmt: skip
        if "sft" not in results:
            results["sft"] = accuracy(sft, cfg)
        t0 = time.perf_counter()
        history = [r for r in train(cfg).history if "reward/mean" in r]
        wall = time.perf_counter() - t0
        final = accuracy(out / f"k{k}" / "final", cfg)
        final["wall_s"] = wall
        final["staleness_mean"] = sum(r.get("async/staleness_mean", 0) for r in history) / len(
            history
        )
        for key in ("async/mid_turn_syncs", "async/turn_boundary_syncs"):
            final[key] = sum(r.get(key, 0) for r in history)
        final["partial_fraction_mean"] = sum(
            r.get("async/partial_fraction", 0) for r in history
        ) / len(history)
        results[f"k{k}"] = final
    for name, r in results.items():
        extra = {
            k: round(v, 3) for k, v in r.items() if k.startswith(("async", "wall", "stal", "part"))
        }
        print(f"{name:5s} greedy accuracy {r['greedy_accuracy']:.3f} ± {r['greedy_accuracy_se']:.3f}"
              f"  tool calls {r['tool_calls_mean']:.2f}  {extra}")  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
