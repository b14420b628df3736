"""verifiers 0.4 (``verifiers.v1``) environments as gspo agent environments: the offline example
taskset (examples/verifiers_v1/vf_arith.py) run by its own ``Env.run_episode`` against an
OpenAI-compatible endpoint, its rubric's reward and metrics kept, an episode cut by a limit
cancelled without leaving a task behind.

The endpoint here is a scripted stub with the agent endpoint's URL layout
(``/episodes/<id>/v1/chat/completions``) and its limit answer (HTTP 400, type
``episode_limit``); the stub's driver cancels the episode's task at a limit as gspo's agent
driver does. verifiers 0.4 pins ``openai<3`` and ``mcp==2.0.0``, so CI runs this file in a venv
with verifiers 0.4 and GSPO_REQUIRE_VERIFIERS=1 (then it must not skip; see .ci/run)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from pathlib import Path

import pytest

if os.environ.get("GSPO_REQUIRE_VERIFIERS") != "1":  # required: a missing verifiers fails
    pytest.importorskip(
        "verifiers", minversion="0.4", reason="needs verifiers 0.4 (gspo[verifiers])"
    )
import verifiers.v1
from aiohttp import web

from gspo.envs.agent import AgentClient, AgentEnvironment
from gspo.envs.base import ENVIRONMENTS
from gspo.envs.tasks.synthetic import TASKS, make_task
from gspo.envs.verifiers_v1 import (
    CHAT_HARNESS,
    VerifiersEpisodeError,
    VerifiersV1Env,
    examples_of,
    load_env,
    register_verifiers_v1,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "verifiers_v1"


@pytest.fixture(autouse=True)
def _example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


class Stub:
    """A scripted OpenAI-compatible endpoint: ``answer(episode, call)`` gives each reply's
    text; past ``max_calls`` calls an episode is answered 400 ``episode_limit``."""

    def __init__(self, answer, max_calls: int = 8, status: int = 200) -> None:
        self.answer, self.max_calls, self.status = answer, max_calls, status
        self.requests: dict[str, list[dict]] = {}
        self.cut: dict[str, asyncio.Event] = {}

    async def chat(self, request: web.Request) -> web.Response:
        episode = request.match_info["episode"]
        body = await request.json()
        calls = self.requests.setdefault(episode, [])
        if len(calls) >= self.max_calls:
            self.cut.setdefault(episode, asyncio.Event()).set()
            error = {"message": "episode limit: max_turns", "type": "episode_limit"}
            return web.json_response({"error": error}, status=400)
        calls.append(body)
        if self.status != 200:
            return web.json_response({"error": {"message": "boom", "type": "x"}}, status=500)
        text = self.answer(episode, len(calls) - 1)
        return web.json_response({
            "id": f"c{len(calls)}", "object": "chat.completion", "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        })  # fmt: skip

    async def __aenter__(self) -> Stub:
        app = web.Application()
        app.router.add_post("/episodes/{episode}/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)  # a free port
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    def client(self, episode: str) -> AgentClient:
        url = f"http://127.0.0.1:{self.port}/episodes/{episode}/v1"
        return AgentClient(url, "unused", "policy", {"temperature": 1.0, "max_tokens": 16})

    async def run(self, env, example, episode: str):
        """One episode as the agent driver runs it: cancelled when the endpoint cut it."""
        task = asyncio.ensure_future(env.run_episode(example, self.client(episode)))
        cut = asyncio.ensure_future(self.cut.setdefault(episode, asyncio.Event()).wait())
        await asyncio.wait([task, cut], return_when=asyncio.FIRST_COMPLETED)
        cut.cancel()
        if self.cut[episode].is_set():
            task.cancel()
        return (await asyncio.gather(task, return_exceptions=True))[0]


def _env(max_turns: int = 1, num_tasks: int = 12):
    vf_env = load_env("vf_arith", taskset={"num_tasks": num_tasks},
                      agent={"harness": {"id": "vf_arith", "max_turns": max_turns}})  # fmt: skip
    return VerifiersV1Env(vf_env, "vf_arith")


def _run(coro):
    """Run ``coro`` in a fresh loop; returns its result and the asyncio errors logged."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("asyncio").addHandler(handler)
    try:
        result = asyncio.run(coro)
        gc.collect()  # a pending task destroyed here would log "Task was destroyed..."
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    return result, [r.getMessage() for r in records]


def _sum(example) -> str:
    return example.answer


def test_single_turn_rubric_reward_and_metrics():
    env = _env()
    assert isinstance(env, AgentEnvironment)
    examples = examples_of(env.vf_env, 2)

    async def main():
        answers = {"e0": examples[0].answer, "e1": "wrong"}
        async with Stub(lambda ep, call: answers[ep]) as stub:
            right = await stub.run(env, examples[0], "e0")
            wrong = await stub.run(env, examples[0], "e1")
            return stub.requests, right, wrong

    (requests, right, wrong), errors = _run(main())
    assert right.reward == 1.0 and right.info == {"vf/correct": 1.0, "vf/turns": 1.0}
    assert wrong.reward == 0.0 and wrong.info["vf/correct"] == 0.0
    # no verdict from a v1 rubric: success is its reward at SUCCESS_AT (1)
    assert (right.success, wrong.success) == (True, False)
    body = requests["e0"][0]  # the run's sampling reaches the endpoint; the model is the client's
    assert body["model"] == "policy" and body["temperature"] == 1.0 and body["max_tokens"] == 16
    assert body["messages"] == [{"role": "user", "content": examples[0].prompt}]
    assert errors == []


def test_multi_turn_episode_extends_its_conversation():
    env = _env(max_turns=3)
    (example,) = examples_of(env.vf_env, 1)

    async def main():
        async with Stub(lambda ep, call: "no" if call == 0 else example.answer) as stub:
            return stub.requests, await stub.run(env, example, "e0")

    (requests, outcome), errors = _run(main())
    assert outcome.reward == 1.0 and outcome.info["vf/turns"] == 2.0
    first, second = requests["e0"]
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert second["messages"][-2:] == [
        {"role": "assistant", "content": "no"},
        {"role": "user", "content": "That is not right. Try again."},
    ]
    assert errors == []


def test_cut_episode_is_cancelled_cleanly(capfd):
    """Four concurrent episodes share one interception server; two are cut by the endpoint's
    limit and cancelled: no task is left pending, nothing is destroyed pending, and the
    others finish with their rewards."""
    env = _env(max_turns=4)
    examples = examples_of(env.vf_env, 4)
    # e0, e1 answer right at once; e2, e3 keep answering wrong until the limit (2 calls)
    script = {f"e{i}": (examples[i].answer if i < 2 else "no") for i in range(4)}

    async def main():
        async with Stub(lambda ep, call: script[ep], max_calls=2) as stub:
            outs = await asyncio.gather(*(stub.run(env, examples[i], f"e{i}") for i in range(4)))
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            return outs, left

    (outs, left), errors = _run(main())
    assert [o.reward for o in outs[:2]] == [1.0, 1.0]
    assert all(isinstance(o, asyncio.CancelledError) for o in outs[2:])
    assert left == [] and errors == []
    err = capfd.readouterr().err
    assert "Task was destroyed but it is pending" not in err and "never awaited" not in err
    # the env serves again after a cut (the shared server was stopped, not left half-torn)
    assert _run(_one(env, examples[0]))[0].reward == 1.0


async def _one(env, example):
    async with Stub(lambda ep, call: example.answer) as stub:
        return await stub.run(env, example, "again")


BARE_TASKSET = """from vf_arith import SumTask, SumTaskset, SumTasksetConfig

__all__ = ["SumTask", "SumTaskset", "SumTasksetConfig"]  # a taskset with no Harness
"""


def test_a_taskset_without_a_harness_runs_gspos_chat_harness_offline(tmp_path, monkeypatch):
    """verifiers' default harness (bash) downloads its program's dependencies: a taskset that
    ships none runs under gspo's in-process chat harness, whose client is closed each episode."""
    import openai

    (tmp_path / "vf_sums_bare.py").write_text(BARE_TASKSET)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert verifiers.v1.default_harness_id("vf_sums_bare") == "bash"
    closed = []
    close = openai.AsyncOpenAI.close

    async def counted_close(self):
        closed.append(self)
        await close(self)

    monkeypatch.setattr(openai.AsyncOpenAI, "close", counted_close)
    env = VerifiersV1Env(load_env("vf_sums_bare", taskset={"num_tasks": 4}), "vf_sums_bare")
    assert env.vf_env.config.agent.harness.id == CHAT_HARNESS
    examples = examples_of(env.vf_env, 2)
    script = {"e0": examples[0].answer, "e1": "wrong"}

    async def main():
        async with Stub(lambda ep, call: script[ep]) as stub:
            outs = [await stub.run(env, examples[i], f"e{i}") for i in range(2)]
            return stub.requests, outs

    (requests, (right, wrong)), errors = _run(main())
    assert (right.reward, right.success, wrong.reward, wrong.success) == (1.0, True, 0.0, False)
    assert requests["e0"][0]["messages"] == [{"role": "user", "content": examples[0].prompt}]
    assert len(requests["e0"]) == len(requests["e1"]) == 1  # one completion per episode
    assert len(closed) == 2 and errors == []  # each episode's client closed
    # a harness named in the config wins (vf_arith's own, as the other tests use)
    named = load_env("vf_sums_bare", agent={"harness": {"id": "vf_arith", "max_turns": 2}})
    assert named.config.agent.harness.id == "vf_arith"


def test_failed_episode_raises():
    env = _env()
    (example,) = examples_of(env.vf_env, 1)

    async def main():
        async with Stub(lambda ep, call: "7", status=500) as stub:
            return await stub.run(env, example, "e0")

    out, _ = _run(main())
    assert isinstance(out, VerifiersEpisodeError) and "verifiers episode failed" in str(out)


def test_register_builds_the_task_and_the_environment():
    register_verifiers_v1("vf_arith_test", "vf_arith", taskset={"num_tasks": 30})
    try:
        task = make_task("vf_arith_test", n_train=20, n_test=5)
        assert (len(task.train), len(task.test)) == (20, 5)
        assert task.train[0].prompt.startswith("What is ") and task.train[0].answer.isdigit()
        env = ENVIRONMENTS["vf_arith_test"](task, None, True)
        assert isinstance(env, VerifiersV1Env) and env.name == "vf_arith_test"
        with pytest.raises(ValueError, match="none left to train"):
            make_task("vf_arith_test", n_train=20, n_test=30)
        assert len(make_task("vf_arith_test", n_train=0, n_test=30).test) == 30  # gspo eval
    finally:
        TASKS.pop("vf_arith_test"), ENVIRONMENTS.pop("vf_arith_test")


# --- through gspo's own endpoint and agent driver -------------------------------------------


def _driver_episodes(env, n_examples: int, limits, n: int = 2):
    pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
    pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
    import torch
    from endpoint_support import TEMPERATURE, TOK, float64_policy

    from gspo.envs.driver import run_episodes
    from gspo.envs.trajectory import PlainEncoder
    from gspo.rollout import SamplingParams

    model, engine = float64_policy()
    examples = examples_of(env.vf_env, n_examples)
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=limits.max_tokens_per_turn)
    generator = torch.Generator().manual_seed(0)
    out = run_episodes(engine, env, PlainEncoder(TOK), examples, n, params, limits, generator)
    return model, out


def _no_pending_task_lost(capfd, caplog) -> None:
    gc.collect()  # a pending task destroyed now would log "Task was destroyed..."
    text = capfd.readouterr().err + caplog.text
    assert "Task was destroyed but it is pending" not in text and "never awaited" not in text


def test_episodes_through_the_endpoint_train_on_the_tokens_served(capfd, caplog):
    """The v1 env's own harness calls gspo's endpoint: every episode's completions are its
    trajectory's policy tokens, whose log-probs the trainer recomputes (float64 policy); the
    rubric's reward is the episode's and its metrics ride along."""
    import torch
    from endpoint_support import TEMPERATURE

    from gspo.envs.driver import Limits, episode_metrics
    from gspo.models.logprobs import token_logprobs

    env = _env(max_turns=2)
    limits = Limits(max_turns=4, max_tokens_per_turn=4, max_total_tokens=200)
    model, (rollout, trajs) = _driver_episodes(env, 2, limits)
    assert [t.finish for t in trajs] == ["stop"] * 4
    for t in trajs:  # a wrong answer gets the harness's feedback and a second call
        assert t.info["vf/turns"] == t.num_turns and t.reward == t.info["vf/correct"]
        assert t.num_turns == (1 if t.reward == 1.0 else 2)
    assert episode_metrics(trajs)["vf/turns"] == sum(t.num_turns for t in trajs) / 4
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
            rollout.completion_mask, temperature=TEMPERATURE,
        )  # fmt: skip
    mask = rollout.loss_mask.bool()  # [N, L]
    assert mask.sum().item() == sum(t.policy_tokens for t in trajs) > 0
    assert (lp[mask] - rollout.logprobs[mask].double()).abs().max().item() < 1e-6
    _no_pending_task_lost(capfd, caplog)


def test_episodes_cut_by_the_driver_earn_the_cut_reward(capfd, caplog):
    """max_turns=1 refuses a wrong first answer's second call: the driver cancels those
    episodes (finish "turns", cut_reward 0), none fails, no task is left pending."""
    from gspo.envs.driver import Limits

    env = _env(max_turns=3)
    limits = Limits(max_turns=1, max_tokens_per_turn=4, max_total_tokens=200)
    _, (_, trajs) = _driver_episodes(env, 2, limits)
    assert {t.finish for t in trajs} <= {"stop", "turns"} and "turns" in {t.finish for t in trajs}
    assert all(t.reward == env.cut_reward for t in trajs if t.finish == "turns")
    _no_pending_task_lost(capfd, caplog)


# --- by name on the command line: --task verifiers:TASKSET ---------------------------------


def test_a_taskset_by_name_trains_and_evaluates_from_the_command_line(tmp_path, monkeypatch):
    """No plugin module: ``--task verifiers:vf_sums_bare,num_tasks=40`` (a taskset module in the
    working directory, with no harness: gspo's chat harness runs it) trains two steps of the
    tiny model through the endpoint, and gspo eval scores the saved model; the rubric's
    scores are logged as vf/<name> and eval/vf/<name> (docs/verifiers.md)."""
    pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
    pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
    import json

    from gspo.interface.cli import main

    (tmp_path / "vf_sums_bare.py").write_text(BARE_TASKSET)
    monkeypatch.chdir(tmp_path)  # found as --plugin modules are: the working directory
    task = ["--task", "verifiers:vf_sums_bare,num_tasks=40", "--threads", "1", "--progress",
            "false", "--max-turns", "1", "--max-tokens-per-turn", "4", "--max-total-tokens", "64"]  # fmt: skip
    out = tmp_path / "run"
    assert main(["train", *task, "--preset", "demo", "--steps", "2", "--n-train", "16",
                 "--n-test", "4", "--prompts-per-step", "2", "--group-size", "2",
                 "--output-dir", str(out)]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward/mean" in r]
    assert len(trained) == 2 and all("vf/correct" in r for r in trained)
    assert rows[-1]["eval/failed"] == 0 and "eval/vf/correct" in rows[-1]
    report = tmp_path / "eval.json"
    assert main(["eval", *task, "--model", str(out / "final"), "--device", "cpu", "--n-test",
                 "4", "--samples", "2", "--output", str(report)]) == 0  # fmt: skip
    got = json.loads(report.read_text())["metrics"]
    assert got["problems"] == 4 and got["failed"] == 0 and "vf/correct" in got
    assert got["success"] == rows[-1]["eval/success"]  # the same held-out tasks and model
