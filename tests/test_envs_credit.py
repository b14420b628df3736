"""Multi-turn credit: turn credit against episode credit and hand-computed turn rewards,
unsupported credit pairings refused (by the loss, the trainer and the config), and the
trainer running a multi-turn task.
"""

from __future__ import annotations

import pytest
import torch

from gspo.envs.credit import check_credit, episode_advantages, returns_to_go, turn_advantages


def test_credit_turn_equals_episode_without_turn_rewards():
    turns = [[0.0, 0.0], [0.0], [0.0, 0.0, 0.0], [0.0]]
    finals = [1.0, 0.0, 1.0, 1.0]
    ids = torch.tensor([[0, -1, 1, -1], [0, -1, -1, -1], [0, 1, -1, 2], [0, 0, -1, -1]])
    per_token = turn_advantages(turns, finals, ids, group_size=2)
    per_ep = episode_advantages(turns, finals, group_size=2, scale="std")
    expected = per_ep[:, None] * (ids >= 0)
    torch.testing.assert_close(per_token, expected.double(), atol=0, rtol=0)


def test_credit_turn_rewards_hand_computed():
    # Episode 0: turn rewards [-0.1, 0], final 1 -> G = [0.9, 1.0]; episode 1: G = [0.0].
    assert returns_to_go([-0.1, 0.0], 1.0, 1.0) == pytest.approx([0.9, 1.0])
    assert returns_to_go([1.0, 1.0], 2.0, 0.5) == pytest.approx([1 + 0.5 * 3, 3.0])
    ids = torch.tensor([[0, -1, 1], [0, 0, -1]])
    adv = turn_advantages([[-0.1, 0.0], [0.0]], [1.0, 0.0], ids, group_size=2)
    # Group mean of G_1 = 0.45, population std 0.45.
    s = 0.45 + 1e-6
    assert adv[0].tolist() == pytest.approx([0.45 / s, 0.0, 0.55 / s])
    assert adv[1].tolist() == pytest.approx([-0.45 / s, -0.45 / s, 0.0])


def test_unsupported_credit_pairings_are_refused():
    check_credit("gspo_token", "turn")
    check_credit("grpo", "turn")
    for algo in ("gspo", "luspo"):
        check_credit(algo, "episode")
        with pytest.raises(ValueError, match="needs a token-level loss"):
            check_credit(algo, "turn")
    with pytest.raises(ValueError, match="credit must be"):
        check_credit("gspo", "step")


def _cfg(tmp_path, **kw):
    from gspo.config import TrainConfig

    base = dict(
        output_dir=str(tmp_path / "run"), task="calculator", steps=1, prompts_per_step=2,
        group_size=2, max_new_tokens=12, n_train=8, n_test=4, eval_every=1, progress=False,
        device="cpu", threads=1, max_total_tokens=40, num_minibatches=1,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig.of(**base)


def test_trainer_runs_a_multi_turn_task(tmp_path):
    from gspo.compose.train import train

    result = train(_cfg(tmp_path, algo="gspo_token", credit="turn"))
    step = next(h for h in result.history if "reward/mean" in h)
    for key in ("episode/turns_mean", "episode/tool_calls_mean", "episode/tool_errors",
                "episode/env_tokens_mean", "episode/policy_tokens_mean"):  # fmt: skip
        assert key in step
    assert "eval/greedy_accuracy" in result.final_eval


def test_trainer_refuses_turn_credit_with_a_sequence_loss(tmp_path):
    from gspo.compose.train import train

    with pytest.raises(ValueError, match="token-level loss"):
        train(_cfg(tmp_path, algo="gspo", credit="turn"))


def test_config_refuses_turn_credit_with_a_sequence_loss():
    from gspo.config import ConfigError, TrainConfig, build

    with pytest.raises(ConfigError, match="token-level loss"):
        build(TrainConfig, overrides={"algo": "luspo", "credit": "turn"})
    with pytest.raises(ConfigError, match="max_turns"):
        build(TrainConfig, overrides={"max_turns": 0})
    assert build(TrainConfig, overrides={"algo": "grpo", "credit": "turn"}).loss.credit == "turn"
