"""Multi-turn episodes on the vLLM engine: the driver sends each round's contexts (token ids)
to ``VLLMEngine.generate`` exactly as to the torch engine; the engine's per-token log-probs of
every turn align with the trainer's forward over the whole trajectory, stop strings end a turn,
and ``gspo train --rollout-engine vllm`` runs a multi-turn task with its episode/* metrics."""

from __future__ import annotations

import json

import pytest
import torch
from envs_support import TOK
from test_envs import EX, EchoEnv, calc_env
from vllm_support import LOGPROB_TOL, needs_vllm, vllm_engine

from gspo.envs.driver import Limits, run_episodes
from gspo.envs.tasks.base import Example
from gspo.envs.trajectory import PlainEncoder
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout.base import SamplingParams


def _model(seed: int = 1):
    # Head size 64 / 2 = 32: the smallest vLLM's CPU attention runs.
    return build_tiny_model(TOK.vocab_size, hidden_size=64, num_heads=2, num_kv_heads=1, seed=seed)


@needs_vllm
@pytest.mark.slow
def test_vllm_episodes_logprobs_align_across_turns_and_stop_strings():
    model = _model()
    with vllm_engine(model, TOK) as engine:
        g = torch.Generator().manual_seed(0)
        params = SamplingParams(
            stop_token_ids=(TOK.eos_token_id,), stop_strings=tuple("abcdefghij0123456789 ")
        )
        rollout, trajs = run_episodes(
            engine, EchoEnv(), PlainEncoder(TOK), [EX, Example("7+8=", "15")], 3, params,
            Limits(max_turns=3, max_tokens_per_turn=6, max_total_tokens=60), g,
        )  # fmt: skip
        # The calculator's stop string "]]" (matched by vLLM on token ids) ends a tool turn.
        calc = run_episodes(
            engine, calc_env(), PlainEncoder(TOK), [EX], 2,
            SamplingParams(temperature=0.0, stop_token_ids=(TOK.eos_token_id,)),
            Limits(max_turns=2, max_tokens_per_turn=20, max_total_tokens=60),
        )[1]  # fmt: skip
    assert max(t.num_turns for t in trajs) == 3
    assert all(t.env_tokens > 0 for t in trajs if t.num_turns > 1)
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
            rollout.completion_mask,
        )  # fmt: skip
    pol = rollout.loss_mask.bool()
    assert pol.sum() > 0 and (rollout.loss_mask <= rollout.completion_mask).all()
    assert (lp[pol] - rollout.logprobs[pol]).abs().max() < LOGPROB_TOL
    assert ((rollout.extras["turn_ids"] >= 0) == pol).all()
    for t in calc:  # a random model: whatever it wrote, no turn runs past a closed call
        first = TOK.decode([i for i, k in zip(t.ids, t.turn, strict=True) if k == 0])
        assert "]]" not in first or first.endswith("]]")


@needs_vllm
@pytest.mark.slow
def test_train_a_multi_turn_task_with_vllm(tmp_path):
    from gspo.compose.train import train
    from gspo.config import TrainConfig

    cfg = TrainConfig.of(
        output_dir=str(tmp_path / "run"), task="calculator", steps=2, prompts_per_step=2,
        group_size=2, max_new_tokens=12, n_train=8, n_test=4, eval_every=2, progress=False,
        device="cpu", threads=1, max_total_tokens=40, num_minibatches=1, hidden_size=64,
        num_heads=2, num_kv_heads=1, rollout_engine="vllm", vllm_cpu_kv_cache_gib=1 / 16,
        old_logprobs="recompute", algo="gspo_token", credit="turn",
    )  # fmt: skip
    result = train(cfg)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
               if x]  # fmt: skip
    steps = [r for r in records if "episode/turns_mean" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["episode/policy_tokens_mean"] > 0
        assert r["mismatch/max_abs"] < 1e-4  # vLLM's log-probs are the trainer's, turn by turn
    assert "eval/greedy_accuracy" in result.final_eval
