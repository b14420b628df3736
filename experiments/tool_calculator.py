"""Multi-turn tasks 1 and 2: 3-digit products with a calculator tool; the guessing game.

    python experiments/tool_calculator.py [--sft-steps 150] [--rl-steps 60] [--out runs/tool_calc]
    python experiments/tool_calculator.py --task guess --out runs/guess

1. SFT cold start of a tiny char model on demonstrations that contain the tool call
   ("[[calc:123*456]] => 56088 56088"), through the project's SFT path (``gspo.compose.sft``).
2. A no-tool baseline: the same model and SFT budget on direct answers ("123*456=" -> "56088").
3. RL from the SFT model with GSPO (episode credit), GSPO-token (per-turn credit) and GRPO
   (per-turn, token-level advantages).

Prints a table of greedy held-out accuracy (± standard error over problems), turns and tool
calls per episode, and the response length (policy tokens) over training; writes
``results.json`` next to the runs.
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
from gspo.envs.calculator import final_answer_reward
from gspo.envs.episodes import Episodes
from gspo.models.model_io import load_model, load_tokenizer
from gspo.models.policy import build_prompt_format
from gspo.orchestration.evaluation import evaluate
from gspo.rollout.torch_engine import TorchEngine

TASK_SETTINGS = {
    # no_tool: the single-turn task of the same problems, for the no-tool baseline
    "calculator": {"no_tool": "multiply", "max_new_tokens": 24, "max_turns": 3},
    "guess": {"no_tool": None, "max_new_tokens": 4, "max_turns": 6},
}
RL_ARMS = [("gspo", "episode"), ("gspo_token", "turn"), ("grpo", "turn")]


def tool_eval(model_dir: Path, cfg: TrainConfig) -> dict[str, float]:
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    task = build_task(cfg)
    fmt = build_prompt_format(cfg.model, tok, model)
    episodes = Episodes(cfg, env_for(task, cfg, fmt.chat), tok, fmt)
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    return episodes.evaluate(engine, task.test)


def no_tool_eval(model_dir: Path, cfg: TrainConfig) -> dict[str, float]:
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    task = build_task(cfg)  # the calculator task's held-out problems, answered in one turn
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    out = evaluate(engine, tok, task.test, final_answer_reward, max_new_tokens=12, samples=0)
    return {"greedy_accuracy": out["greedy_accuracy"], "greedy_accuracy_se": out["greedy_accuracy_se"],
            "success": out["greedy_accuracy"], "success_se": out["greedy_accuracy_se"],
            "turns_mean": 1.0, "tool_calls_mean": 0.0}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/tool_calc")
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--rl-steps", type=int, default=60)
    ap.add_argument("--rl-lr", type=float, default=3e-4)  # 1e-3 collapses (no tool calls)
    ap.add_argument("--task", choices=sorted(TASK_SETTINGS), default="calculator")
    ap.add_argument("--digits", type=int, default=None, help="difficulty; None: the task's")
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    torch.manual_seed(args.seed)
    setting = TASK_SETTINGS[args.task]
    common = dict(seed=args.seed, device="cpu", threads=1, difficulty=args.digits, n_test=args.n_test,
                  hidden_size=128, num_layers=3)  # fmt: skip
    episode = dict(max_new_tokens=setting["max_new_tokens"], max_turns=setting["max_turns"],
                   max_total_tokens=64)  # fmt: skip
    rows: dict[str, dict] = {}
    t0 = time.perf_counter()
    for name, task in (("sft_tool", args.task), ("sft_no_tool", setting["no_tool"])):
        if task is None:
            continue
        if (out / name / "config.json").exists():  # reuse a finished cold start
            continue
        run_sft(SFTConfig(output_dir=str(out / name), task=task, steps=args.sft_steps,
                          batch_size=64, n_train=5000, progress=False, max_new_tokens=12,
                          **{**common, "n_test": 0}))  # fmt: skip
    base = TrainConfig.of(output_dir=str(out / "unused"), task=args.task, **episode, **common)
    if setting["no_tool"]:
        rows["no-tool SFT"] = no_tool_eval(out / "sft_no_tool", base)
    rows["SFT"] = tool_eval(out / "sft_tool", base)
    print(f"SFT done in {time.perf_counter() - t0:.0f} s", flush=True)
    curves: dict[str, list[float]] = {}
    for algo, credit in RL_ARMS:
        cfg = TrainConfig.of(
            output_dir=str(out / f"rl_{algo}"), model=str(out / "sft_tool"),
            task=args.task, algo=algo, credit=credit, steps=args.rl_steps,
            prompts_per_step=16, group_size=8, lr=args.rl_lr, warmup_steps=2,
            num_minibatches=2, eval_every=0, checkpoint_every=0, progress=False, n_train=2000,
            seed=args.seed, device="cpu", threads=1, difficulty=args.digits, n_test=args.n_test,
            **episode,
        )  # fmt: skip
        result = train(cfg)
        steps = [h for h in result.history if "reward/mean" in h]
        curves[algo] = [h["response_length/mean"] for h in steps]
        rows[f"RL {algo} ({credit} credit)"] = {
            **tool_eval(out / f"rl_{algo}" / "final", cfg),
            "train_reward_first": steps[0]["reward/mean"],
            "train_reward_last": steps[-1]["reward/mean"],
        }
        print(f"{algo} done at {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"\n{'arm':34s} {'held-out acc':>16s} {'success':>16s} {'turns':>6s} {'tools':>6s}")
    for name, r in rows.items():
        acc = f"{r['greedy_accuracy']:.3f} ± {r['greedy_accuracy_se']:.3f}"
        won = f"{r['success']:.3f} ± {r['success_se']:.3f}"
        print(
            f"{name:34s} {acc:>16s} {won:>16s} {r['turns_mean']:6.2f} {r['tool_calls_mean']:6.2f}"
        )
    for algo, c in curves.items():
        pts = ", ".join(f"{x:.1f}" for x in c[:: max(1, len(c) // 6)])
        print(f"response length (policy tokens) over training, {algo}: {pts}")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows,
                                                  "response_length": curves}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
