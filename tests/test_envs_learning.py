"""Task 1 learning (issue 21): after an SFT cold start on tool-call demonstrations and a short
GSPO-token run with per-turn credit, the tool-using policy beats the no-tool baseline (the same
SFT budget on direct answers) and its own SFT start on held-out 3-digit products.

The full experiment (three algorithms, 500 held-out problems) is experiments/tool_calculator.py;
this is its small version (~60-90 s on one busy core)."""

from __future__ import annotations

import pytest
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

SHAPE = dict(hidden_size=128, num_layers=3, seed=0, device="cpu", threads=1)
EPISODE = dict(max_new_tokens=24, max_turns=3, max_total_tokens=64)


def _engine(path):
    model, tok = load_model(path), load_tokenizer(path)
    return model, tok, TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
                                   tokenizer=tok)  # fmt: skip


def _tool_accuracy(path, cfg: TrainConfig) -> tuple[float, float, dict]:
    model, tok, engine = _engine(path)
    task = build_task(cfg)
    fmt = build_prompt_format(cfg.model, tok, model)
    opts = cfg
    episodes = Episodes(opts, env_for(task, opts.task, fmt.chat), tok, fmt)
    out = evaluate(engine, tok, task.test, task.reward, max_new_tokens=cfg.rollout.max_new_tokens,
                   samples=0, prompt_format=fmt, env=episodes.eval_env,
                   limits=episodes.limits)  # fmt: skip
    return out["greedy_accuracy"], out["greedy_accuracy_se"], out


@pytest.mark.slow
def test_rl_with_the_calculator_beats_sft_and_the_no_tool_baseline(tmp_path):
    torch.manual_seed(0)
    for name, task in (("tool", "calculator"), ("no_tool", "multiply")):
        run_sft(SFTConfig(output_dir=str(tmp_path / name), task=task, steps=150, batch_size=64,
                          n_test=0, progress=False, **SHAPE))  # fmt: skip
    cfg = TrainConfig.of(
        output_dir=str(tmp_path / "rl"), model=str(tmp_path / "tool"), task="calculator",
        algo="gspo_token", credit="turn", steps=25, prompts_per_step=16, group_size=8, lr=3e-4,
        warmup_steps=2, num_minibatches=2, eval_every=0, checkpoint_every=0, progress=False,
        n_train=2000, n_test=200, **EPISODE, **SHAPE,
    )  # fmt: skip
    sft_acc, sft_se, _ = _tool_accuracy(tmp_path / "tool", cfg)
    train(cfg)
    rl_acc, rl_se, rl = _tool_accuracy(tmp_path / "rl" / "final", cfg)
    # The no-tool baseline: the same held-out problems answered in one turn.
    _, tok, engine = _engine(tmp_path / "no_tool")
    direct = evaluate(engine, tok, build_task(cfg).test, final_answer_reward, max_new_tokens=12,
                      samples=0)  # fmt: skip
    no_tool, no_tool_se = direct["greedy_accuracy"], direct["greedy_accuracy_se"]
    print(f"no-tool {no_tool:.3f}±{no_tool_se:.3f}  SFT {sft_acc:.3f}±{sft_se:.3f}  "
          f"RL {rl_acc:.3f}±{rl_se:.3f}  tool calls {rl['tool_calls_mean']:.2f}")  # fmt: skip
    assert rl["tool_calls_mean"] > 0.9  # the policy uses the tool
    assert rl_acc - no_tool > 3 * max(rl_se, no_tool_se, 0.01)
    assert rl_acc > sft_acc  # and RL improves on its cold start
