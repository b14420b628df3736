"""Agent episodes (gspo.envs.agent_driver): every chain of calls of an episode trains, one row
each with the episode's reward and advantage, on exactly the tokens served; an agent that hangs
is cut by the episode timeout like a turn limit."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
httpx = pytest.importorskip("httpx", reason="the agents call the endpoint with httpx")

from endpoint_support import TEMPERATURE, TOK, float64_policy  # noqa: E402

from gspo.core.losses import group_advantages  # noqa: E402
from gspo.envs.agent import AgentOutcome  # noqa: E402
from gspo.envs.agent_driver import chain_advantages  # noqa: E402
from gspo.envs.driver import Limits, episode_metrics, run_episodes  # noqa: E402
from gspo.envs.tasks.base import Example  # noqa: E402
from gspo.envs.trajectory import PlainEncoder  # noqa: E402
from gspo.models.logprobs import token_logprobs  # noqa: E402
from gspo.rollout import SamplingParams  # noqa: E402

PARAMS = SamplingParams(temperature=TEMPERATURE, max_new_tokens=4)
EXAMPLES = [Example("12+3=", "15"), Example("4+4=", "8")]
LIMITS = Limits(max_turns=4, max_tokens_per_turn=4, max_total_tokens=64)


class SummarizingAgent:
    """Two chat calls, then a third on a rewritten history (a summary): two chains of calls.
    Reward: the episode's number (0-0 -> 0, 0-1 -> 1, ...), so episodes' rewards differ."""

    name = "summarizer"

    async def run_episode(self, example: Example, client) -> AgentOutcome:
        messages = [{"role": "user", "content": example.prompt}]
        async with httpx.AsyncClient(base_url=client.base_url, timeout=60) as http:
            for turn in range(2):
                body = (await http.post("/chat/completions", json={"messages": messages})).json()
                messages += [{"role": "assistant", "content": body["choices"][0]["message"]
                              ["content"]}, {"role": "user", "content": f"|{turn}|"}]  # fmt: skip
            summary = [{"role": "user", "content": "sum:" + example.prompt}]  # history rewritten
            await http.post("/chat/completions", json={"messages": summary})
        episode = client.base_url.split("/episodes/")[1].split("/")[0]
        i, j = map(int, episode.split("-"))
        return AgentOutcome(reward=float(2 * i + j), success=True)


def _run(engine, agent, all_chains: bool, limits: Limits = LIMITS):
    generator = torch.Generator().manual_seed(0)
    return run_episodes(engine, agent, PlainEncoder(TOK), EXAMPLES, 2, PARAMS, limits,
                        generator, all_chains=all_chains)  # fmt: skip


def test_every_chain_of_an_episode_trains_as_a_row_with_the_episodes_reward():
    model, engine = float64_policy()
    rollout, trajs = _run(engine, SummarizingAgent(), all_chains=True)
    # Two chains per episode (2 calls, then 1 on the summary), in episode order.
    assert [t.episode for t in trajs] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [t.num_turns for t in trajs] == [2, 1] * 4
    assert [t.reward for t in trajs] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert all(t.finish == "stop" and t.success for t in trajs)
    assert all("unchained_calls" not in t.info for t in trajs)
    assert rollout.prompt_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # Every row carries exactly the served tokens and log-probs: the trainer's recompute of
    # the summary chains equals them as it does the first chains' (float64, contract tolerance).
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
            rollout.completion_mask, temperature=TEMPERATURE,
        )  # fmt: skip  # [N, L]
    mask = rollout.loss_mask.bool()  # [N, L]
    assert (mask.sum(dim=1) > 0).all()  # every row has policy tokens: all chains train
    assert (lp[mask] - rollout.logprobs[mask].double()).abs().max().item() < 1e-6
    # Before: one row per episode, the last chain (the summary), the other calls dropped.
    _, last = _run(engine, SummarizingAgent(), all_chains=False)
    assert [t.num_turns for t in last] == [1] * 4
    assert [t.info["unchained_calls"] for t in last] == [2.0] * 4


def test_chain_rows_share_their_episodes_group_advantage():
    returns = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 3.0, 3.0], dtype=torch.float64)
    episodes = [0, 0, 1, 1, 1, 2, 3, 3]  # episode 1 has three chains, episode 2 one
    adv = chain_advantages(returns, episodes, group_size=2, scale="std")
    per_episode = group_advantages(torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64), 2)
    assert torch.equal(adv, per_episode[episodes])  # an episode's weight is not its chains'
    with pytest.raises(ValueError, match="numbered"):
        chain_advantages(returns[:2], [0, 2], group_size=2, scale="std")


class HangingAgent:
    """Example 0: one completion, then waits for ever; example 1: done without a call."""

    name = "hangs"
    cut_reward = -0.5

    async def run_episode(self, example: Example, client) -> AgentOutcome:
        if example is EXAMPLES[1]:
            return AgentOutcome(reward=1.0, success=True)
        async with httpx.AsyncClient(base_url=client.base_url, timeout=60) as http:
            await http.post("/completions", json={"prompt": example.prompt})
        await asyncio.Event().wait()  # never set
        raise AssertionError("unreachable")


def test_an_agent_that_hangs_is_cut_by_the_episode_timeout_like_a_turn_limit():
    _, engine = float64_policy()
    limits = Limits(max_turns=4, max_tokens_per_turn=4, max_total_tokens=64,
                    episode_timeout_s=1.0)  # fmt: skip
    rollout, trajs = _run(engine, HangingAgent(), all_chains=True, limits=limits)
    assert [t.finish for t in trajs] == ["timeout", "timeout", "stop", "stop"]
    assert [t.reward for t in trajs] == [-0.5, -0.5, 1.0, 1.0]  # the cut reward
    assert [t.success for t in trajs] == [False, False, True, True]
    metrics = episode_metrics(trajs)
    assert metrics["episode/timeout_fraction"] == 0.5 and metrics["episode/failed"] == 0
    assert rollout.finish_reasons == ["timeout", "timeout", "stop", "stop"]


def test_a_run_trains_every_chain_of_its_agent_episodes(tmp_path, monkeypatch):
    import gspo.compose.train as trainer_module
    from gspo.config import TrainConfig, build
    from gspo.envs import ENVIRONMENTS

    monkeypatch.setitem(ENVIRONMENTS, "addition", lambda task, opts, chat: SummarizingAgent())
    overrides = {"device": "cpu", "threads": 1, "output_dir": str(tmp_path), "task": "addition",
                 "max_turns": 4, "max_total_tokens": 48, "steps": 2, "eval_every": 0}  # fmt: skip
    cfg = build(TrainConfig, preset="smoke", overrides=overrides)
    steps = [r for r in trainer_module.train(cfg).history if "reward/mean" in r]
    assert len(steps) == 2
    for record in steps:
        # Rows of both chains (2 calls, then 1): 1.5 turns per row, none failed or cut.
        assert record["episode/turns_mean"] == 1.5 and record["episode/failed"] == 0
        assert record["episode/timeout_fraction"] == 0
