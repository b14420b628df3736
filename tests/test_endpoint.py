"""The OpenAI-compatible rollout endpoint (gspo.rollout.openai_server) and agent episodes
(gspo.envs.agent_driver): token ids and log-probs as the trainer recomputes them, token-in /
token-out chat, deterministic rounds, limits and failures."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
httpx = pytest.importorskip("httpx", reason="the endpoint tests call it with httpx")

from endpoint_support import TEMPERATURE, TOK, TOLERANCE, float64_policy, recompute  # noqa: E402

from gspo.envs.agent import AgentOutcome  # noqa: E402
from gspo.envs.driver import Limits, run_episodes  # noqa: E402
from gspo.envs.tasks.base import Example  # noqa: E402
from gspo.envs.trajectory import ChatEncoder, PlainEncoder  # noqa: E402
from gspo.models.char_tokenizer import EOS_ID, build_char_tokenizer  # noqa: E402
from gspo.models.logprobs import token_logprobs  # noqa: E402
from gspo.rollout import SamplingParams  # noqa: E402
from gspo.rollout.openai_server import OpenAIEndpoint, ServerThread  # noqa: E402
from gspo.rollout.request_batcher import RequestBatcher  # noqa: E402

PARAMS = SamplingParams(temperature=TEMPERATURE, max_new_tokens=5)
EXAMPLES = [Example("12+3=", "15"), Example("4+4=", "8")]


@pytest.fixture(scope="module")
def policy():
    return float64_policy()


@pytest.fixture
def server(policy):
    _, engine = policy
    batcher = RequestBatcher(engine.generate, generator=torch.Generator().manual_seed(0))
    endpoint = OpenAIEndpoint(batcher, PlainEncoder(TOK), "tiny", PARAMS)
    srv = ServerThread(endpoint).start()  # 127.0.0.1, a free port
    yield srv
    srv.stop()


def test_completions_token_in_carry_the_ids_and_logprobs_the_trainer_recomputes(policy, server):
    model, _ = policy
    prompt = TOK("7+8=", add_special_tokens=True)["input_ids"]
    as_ids = httpx.post(server.url() + "/completions", json={"prompt": prompt, "n": 2}).json()
    as_text = httpx.post(server.url() + "/completions", json={"prompt": "7+8="}).json()
    assert as_text["prompt_token_ids"] == as_ids["prompt_token_ids"] == prompt
    assert len(as_ids["choices"]) == 2
    for choice in as_ids["choices"]:
        ids, logprobs = choice["token_ids"], choice["token_logprobs"]  # the end token included
        assert ids and len(ids) == len(logprobs) <= PARAMS.max_new_tokens
        assert choice["text"] == TOK.decode(ids, skip_special_tokens=True)
        shown = len(ids) - (ids[-1] == EOS_ID)  # the OpenAI text tokens: no end token
        assert choice["logprobs"]["token_logprobs"] == logprobs[:shown]
        gap = (recompute(model, prompt, ids) - torch.tensor(logprobs, dtype=torch.float64)).abs()
        assert gap.max().item() < TOLERANCE


def test_the_endpoint_refuses_bad_requests_in_one_line(server):
    url = server.url()
    got = httpx.post(url + "/completions", json={"prompt": {"x": 1}})
    assert got.status_code == 400 and "list of token ids" in got.json()["error"]["message"]
    got = httpx.post(server.url("nobody") + "/completions", json={"prompt": "1"})
    assert got.status_code == 404
    assert httpx.get(url + "/models").json()["data"][0]["id"] == "tiny"


class ChatAgent:
    """An in-process agent: ``turns`` chat requests, each repeating the conversation with the
    assistant's answer and a new user message; records the responses it got."""

    def __init__(self, turns: int = 3, fail_on: str | None = None, endless: bool = False):
        self.name, self.turns, self.fail_on, self.endless = "chat_agent", turns, fail_on, endless
        self.responses: dict[str, list[dict]] = {}

    async def run_episode(self, example: Example, client) -> AgentOutcome:
        if example.prompt == self.fail_on:
            raise RuntimeError("the agent broke")
        messages = [{"role": "user", "content": example.prompt}]
        got = self.responses.setdefault(client.base_url.split("/episodes/")[1], [])
        async with httpx.AsyncClient(base_url=client.base_url, timeout=60) as http:
            turn = 0
            while self.endless or turn < self.turns:
                # Episodes reach the endpoint in a different order every time.
                await asyncio.sleep(0.001 * (hash(client.base_url) % 7))
                reply = await http.post("/chat/completions", json={"messages": messages})
                reply.raise_for_status()
                body = reply.json()
                got.append(body)
                text = body["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": text},
                             {"role": "user", "content": f"|{turn}|"}]  # fmt: skip
                turn += 1
        return AgentOutcome(reward=float(len(got)), success=True, info={"turns": float(turn)})


def _episodes(engine, agent, limits=None, seed=0, n=2, encoder=None):
    limits = limits or Limits(max_turns=4, max_tokens_per_turn=5, max_total_tokens=64)
    generator = torch.Generator().manual_seed(seed)
    encoder = encoder or PlainEncoder(TOK)
    return run_episodes(engine, agent, encoder, EXAMPLES, n, PARAMS, limits, generator)


def chat_encoder() -> ChatEncoder:
    """The character tokenizer with a chat template (end of turn: <eos>)."""
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return ChatEncoder(tok, EOS_ID)


@pytest.mark.parametrize("template", [False, True], ids=["plain", "chat-template"])
def test_a_multi_call_chat_episode_trains_on_exactly_the_tokens_it_was_served(policy, template):
    model, engine = policy
    agent = ChatAgent(turns=3)
    encoder = chat_encoder() if template else PlainEncoder(TOK)
    rollout, trajs = _episodes(engine, agent, encoder=encoder)
    assert [t.finish for t in trajs] == ["stop"] * 4 and [t.num_turns for t in trajs] == [3] * 4
    assert [t.success for t in trajs] == [True] * 4  # the agent's verdict, kept on the row
    assert all("unchained_calls" not in t.info for t in trajs)
    # Token-in, token-out: each request's prompt is the previous prompt + the sampled ids as
    # served (an end token included, which re-tokenizing the decoded text would lose) + the
    # tokens of the new message only (with a template: what it adds after the assistant turn).
    for bodies in agent.responses.values():
        for turn, (before, after) in enumerate(itertools.pairwise(bodies)):
            served = before["prompt_token_ids"] + before["choices"][0]["token_ids"]
            assert after["prompt_token_ids"][: len(served)] == served
            added = encoder.tokenizer.decode(after["prompt_token_ids"][len(served) :])
            if template:
                ended = before["choices"][0]["token_ids"][-1] == EOS_ID
                assert added == ("" if ended else "<eos>") + f"user: |{turn}|<eos>assistant: "
            else:
                assert added == f"|{turn}|"
    # The trainer's recompute of the packed rows equals the log-probs served (float64, the
    # engine contract's tolerance); the packed rows hold them (float32, as every episode's).
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
            rollout.completion_mask, temperature=TEMPERATURE,
        )  # fmt: skip
    mask = rollout.loss_mask.bool()  # [N, L]
    for row, eid in enumerate(["0-0", "0-1", "1-0", "1-1"]):
        bodies = agent.responses[f"{eid}/v1"]
        served = [x for b in bodies for x in b["choices"][0]["token_logprobs"]]
        served = torch.tensor(served, dtype=torch.float64)
        assert (lp[row][mask[row]] - served).abs().max().item() < TOLERANCE
        assert (rollout.logprobs[row][mask[row]].double() - served).abs().max().item() < 1e-6
    assert rollout.extras["policy_version"].tolist() == [0] * 4
    assert torch.equal(rollout.prompt_index, torch.tensor([0, 0, 1, 1]))


def test_rounds_are_deterministic_whatever_order_requests_arrive_in(policy):
    _, engine = policy
    a, _ = _episodes(engine, ChatAgent(turns=2), seed=5)
    b, _ = _episodes(engine, ChatAgent(turns=2), seed=5)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.logprobs, b.logprobs)


class CutAgent(ChatAgent):
    cut_reward = 0.25


def test_limits_cut_episodes_with_the_cut_reward_and_agent_errors_fail_only_theirs(policy):
    _, engine = policy
    turns = Limits(max_turns=2, max_tokens_per_turn=5, max_total_tokens=1000)
    _, trajs = _episodes(engine, CutAgent(endless=True, fail_on="4+4="), turns)
    assert [t.finish for t in trajs] == ["turns", "turns", "failed", "failed"]
    assert [t.reward for t in trajs] == [0.25, 0.25, 0.0, 0.0]
    assert [t.success for t in trajs] == [False] * 4  # neither a cut nor a failed one succeeds
    assert [t.num_turns for t in trajs[:2]] == [2, 2]
    tokens = Limits(max_turns=100, max_tokens_per_turn=5, max_total_tokens=12)
    _, trajs = _episodes(engine, ChatAgent(endless=True), tokens)
    assert [t.finish for t in trajs] == ["length"] * 4 and [t.reward for t in trajs] == [0.0] * 4
    assert all(len(t.ids) <= 12 for t in trajs)


class FixedEngine:
    """Answers every prompt with the same ids: "4", <unk>, "2", <eos> (log-prob -1 each)."""

    def __init__(self) -> None:
        self.ids = [*TOK("4", add_special_tokens=False)["input_ids"], TOK.unk_token_id]
        self.ids += [*TOK("2", add_special_tokens=False)["input_ids"], TOK.eos_token_id]

    def generate(self, request):
        from gspo.rollout import Rollout

        prompts, n = request.prompts, request.n

        rows = len(prompts) * n
        ids = torch.tensor([self.ids] * rows)  # [N, 4]
        return Rollout(
            prompt_ids=torch.ones((rows, 1), dtype=torch.long),
            prompt_mask=torch.ones((rows, 1), dtype=torch.long),
            completion_ids=ids,
            completion_mask=torch.ones_like(ids),
            logprobs=-torch.ones(ids.shape),
            finish_reasons=["stop"] * rows,
            prompt_index=torch.arange(rows) // n,
        )


@pytest.mark.parametrize("template", [False, True], ids=["plain", "chat-template"])
def test_chat_continuation_keeps_sampled_ids_that_the_text_cannot_hold(template):
    # "4<unk>2" decodes to "42": re-tokenizing the assistant's text would drop <unk>.
    engine = FixedEngine()
    encoder = chat_encoder() if template else PlainEncoder(TOK)
    endpoint = OpenAIEndpoint(RequestBatcher(engine.generate), encoder, "fixed", PARAMS)
    srv = ServerThread(endpoint).start()
    try:
        messages = [{"role": "user", "content": "6*7="}]
        first = httpx.post(srv.url() + "/chat/completions", json={"messages": messages}).json()
        assert first["choices"][0]["message"]["content"] == "42"
        messages += [{"role": "assistant", "content": "42"}, {"role": "user", "content": "ok?"}]
        second = httpx.post(srv.url() + "/chat/completions", json={"messages": messages}).json()
    finally:
        srv.stop()
    served = first["prompt_token_ids"] + engine.ids
    assert second["prompt_token_ids"][: len(served)] == served


def test_a_round_waits_for_every_live_episode_and_falls_back_when_one_waits_elsewhere():
    engine = FixedEngine()
    prompt = TOK("1+1=", add_special_tokens=True)["input_ids"]

    async def play(chained: bool) -> tuple[int, int]:
        batcher = RequestBatcher(engine.generate, patience_s=0.05)
        runner = asyncio.create_task(batcher.run())
        batcher.register("a")
        batcher.register("b")
        if chained:  # b asks only once a has its answer: a round cannot wait for both
            await batcher.submit("a", prompt, 1, PARAMS)
            await batcher.submit("b", prompt, 1, PARAMS)
        else:
            await asyncio.gather(*(batcher.submit(e, prompt, 1, PARAMS) for e in "ab"))
        runner.cancel()
        return batcher.rounds, batcher.fallback_rounds

    assert asyncio.run(play(chained=False)) == (1, 0)  # one generate call for both
    assert asyncio.run(play(chained=True)) == (2, 2)  # the liveness fallback, twice
