"""The OpenAI-compatible endpoint over the vLLM engine (gspo.rollout.openai_vllm): requests
parsed and responses built with vLLM's own protocol types, sampling through gspo's VLLMEngine;
served token ids and log-probs equal the trainer's recompute within the vLLM engine contract's
tolerance (tests/vllm_support.py: LOGPROB_TOL), for completions and a multi-call chat episode;
``gspo serve --engine vllm`` answers an ``openai`` client. One vLLM engine for the module (its
start-up is slow on CPU)."""

from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
httpx = pytest.importorskip("httpx", reason="the endpoint tests call it with httpx")

from vllm_support import LOGPROB_TOL, needs_vllm, vllm_engine  # noqa: E402

from gspo.envs.agent import AgentOutcome  # noqa: E402
from gspo.envs.driver import Limits, run_episodes  # noqa: E402
from gspo.envs.tasks.base import Example  # noqa: E402
from gspo.envs.trajectory import PlainEncoder  # noqa: E402
from gspo.models.char_tokenizer import build_char_tokenizer  # noqa: E402
from gspo.models.logprobs import token_logprobs  # noqa: E402
from gspo.models.tiny_model import build_tiny_model  # noqa: E402
from gspo.rollout import SamplingParams  # noqa: E402
from gspo.rollout.openai_server import OpenAIEndpoint, ServerThread  # noqa: E402
from gspo.rollout.openai_vllm import VLLMProtocol, protocol_for  # noqa: E402
from gspo.rollout.request_batcher import RequestBatcher  # noqa: E402

pytestmark = [needs_vllm, pytest.mark.slow]  # the fast tier leaves vLLM out

TOK = build_char_tokenizer()
TEMPERATURE = 0.7
PARAMS = SamplingParams(temperature=TEMPERATURE, max_new_tokens=5)
EXAMPLES = [Example("12+3=", "15"), Example("4+4=", "8")]


@pytest.fixture(scope="module")
def policy():
    model = build_tiny_model(len(TOK), hidden_size=128, num_layers=2, num_heads=4, seed=0)
    with vllm_engine(model, TOK) as engine:
        yield model, engine


@pytest.fixture(scope="module")
def server(policy):
    _, engine = policy
    assert isinstance(protocol_for(engine), VLLMProtocol)  # the vLLM engine gets vLLM's types
    batcher = RequestBatcher(engine.generate, generator=torch.Generator().manual_seed(0))
    endpoint = OpenAIEndpoint(
        batcher, PlainEncoder(TOK), "tiny", PARAMS, protocol=protocol_for(engine)
    )
    srv = ServerThread(endpoint).start()  # 127.0.0.1, a free port
    yield srv
    srv.stop()


def recompute(model, prompt: list[int], completion: list[int]) -> torch.Tensor:  # [L]
    p, c = torch.tensor([prompt]), torch.tensor([completion])  # [1, P], [1, L]
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, p, torch.ones_like(p), c, torch.ones_like(c), temperature=TEMPERATURE
        )
    return lp[0]


def test_completions_are_vllm_responses_with_the_ids_and_logprobs_the_trainer_recomputes(
    policy, server
):
    CompletionResponse = VLLMProtocol().t["CompletionResponse"]  # wherever this vLLM keeps it
    model, _ = policy
    prompt = TOK("7+8=", add_special_tokens=True)["input_ids"]
    body = httpx.post(server.url() + "/completions", json={"prompt": prompt, "n": 2}).json()
    as_text = httpx.post(server.url() + "/completions", json={"prompt": "7+8="}).json()
    reply = CompletionResponse.model_validate(body)  # vLLM's own response model reads it back
    assert as_text["prompt_token_ids"] == body["prompt_token_ids"] == prompt
    assert len(reply.choices) == 2
    for choice, raw in zip(reply.choices, body["choices"], strict=True):
        ids, logprobs = choice.token_ids, raw["token_logprobs"]  # gspo's: the end token included
        assert choice.prompt_token_ids == prompt
        # Unset fields keep the run's defaults, not vLLM's (max_tokens 16 for completions).
        assert ids and len(ids) == len(logprobs) <= PARAMS.max_new_tokens
        assert choice.text == TOK.decode(ids, skip_special_tokens=True)
        shown = len(ids) - (ids[-1] == TOK.eos_token_id)  # the text tokens: no end token
        assert choice.logprobs.text_offset[0] == 0 and len(choice.logprobs.tokens) == shown
        gap = (recompute(model, prompt, ids) - torch.tensor(logprobs)).abs()
        assert gap.max().item() < LOGPROB_TOL


def test_requests_are_parsed_by_vllm_and_errors_are_vllm_shaped(server):
    url = server.url()
    hi = [{"role": "user", "content": "1+"}]
    got = httpx.post(url + "/chat/completions", json={"messages": hi, "max_completion_tokens": 2})
    assert got.status_code == 200 and 1 <= len(got.json()["choices"][0]["token_ids"]) <= 2
    got = httpx.post(url + "/chat/completions", json={"messages": hi, "n": "two"})
    error = got.json()["error"]  # vLLM's ErrorResponse: the HTTP status as its code
    assert got.status_code == 400 and error["code"] == 400 and error["message"].startswith("n:")
    asks = {"messages": hi, "logprobs": True, "top_logprobs": 2}  # alternatives: refused
    got = httpx.post(url + "/chat/completions", json=asks)
    assert got.status_code == 400 and "top_logprobs" in got.json()["error"]["message"]
    got = httpx.post(server.url("nobody") + "/completions", json={"prompt": "1"})
    assert got.status_code == 404 and got.json()["error"]["code"] == 404
    models = httpx.get(url + "/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["owned_by"] == "gspo"


def test_seeds_and_streams_over_vllm_as_over_the_torch_engine(server):
    openai = pytest.importorskip("openai", reason="the test uses the official openai client")
    client = openai.OpenAI(base_url=server.url(), api_key="any", max_retries=0)
    hi = [{"role": "user", "content": "12+3="}]

    def ask(**kw):
        return client.chat.completions.create(model="tiny", messages=hi, temperature=1.0, **kw)

    first, again = ask(seed=5), ask(seed=5)  # vLLM's per-prompt seed drawn from the request's
    assert first.choices[0].model_extra["token_ids"] == again.choices[0].model_extra["token_ids"]
    text, ids = "", []
    for chunk in ask(seed=5, stream=True):  # vLLM's chunk shape, parsed by the openai client
        for c in chunk.choices:
            text += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids", [])
    assert text == first.choices[0].message.content
    assert ids == first.choices[0].model_extra["token_ids"]


class ChatAgent:
    """Three chat requests, each repeating the conversation with the answer and a new message."""

    name = "chat_agent"

    def __init__(self):
        self.responses: dict[str, list[dict]] = {}

    async def run_episode(self, example: Example, client) -> AgentOutcome:
        messages = [{"role": "user", "content": example.prompt}]
        got = self.responses.setdefault(client.base_url.split("/episodes/")[1], [])
        async with httpx.AsyncClient(base_url=client.base_url, timeout=120) as http:
            for turn in range(3):
                reply = await http.post("/chat/completions", json={"messages": messages})
                reply.raise_for_status()
                got.append(reply.json())
                text = got[-1]["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": text},
                             {"role": "user", "content": f"|{turn}|"}]  # fmt: skip
        return AgentOutcome(reward=1.0, success=True)


def test_a_chat_episode_over_vllm_trains_on_exactly_the_tokens_it_was_served(policy):
    ChatCompletionResponse = VLLMProtocol().t["ChatCompletionResponse"]
    model, engine = policy
    agent = ChatAgent()
    limits = Limits(max_turns=4, max_tokens_per_turn=5, max_total_tokens=64)
    generator = torch.Generator().manual_seed(0)
    rollout, trajs = run_episodes(
        engine, agent, PlainEncoder(TOK), EXAMPLES, 2, PARAMS, limits, generator
    )
    assert [t.num_turns for t in trajs] == [3] * 4
    for bodies in agent.responses.values():
        for body in bodies:
            ChatCompletionResponse.model_validate(body)  # built with vLLM's types
        for turn, (before, after) in enumerate(itertools.pairwise(bodies)):
            served = before["prompt_token_ids"] + before["choices"][0]["token_ids"]
            assert after["prompt_token_ids"][: len(served)] == served  # token-in, token-out
            assert TOK.decode(after["prompt_token_ids"][len(served) :]) == f"|{turn}|"
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
            rollout.completion_mask, temperature=TEMPERATURE,
        )  # fmt: skip  # [N, L]
    mask = rollout.loss_mask.bool()  # [N, L]
    worst = 0.0
    for row, eid in enumerate(["0-0", "0-1", "1-0", "1-1"]):
        bodies = agent.responses[f"{eid}/v1"]
        served = torch.tensor([x for b in bodies for x in b["choices"][0]["token_logprobs"]])
        assert len(served) == int(mask[row].sum())
        worst = max(worst, (lp[row][mask[row]] - served).abs().max().item())
        assert torch.equal(rollout.logprobs[row][mask[row]], served)
    print(f"chat episode over vLLM: max |served - trainer| log-prob {worst:.1e}")  # docs figure
    assert worst < LOGPROB_TOL


def test_gspo_serve_with_the_vllm_engine_answers_an_openai_client(tmp_path):
    openai = pytest.importorskip("openai", reason="the test calls gspo serve with openai")
    from gspo.models.model_io import save_model

    # A checkpoint folder, as a run's final/: head size 64 / 2 = 32, the smallest vLLM's CPU
    # attention runs (the built-in "tiny" has 16).
    model = build_tiny_model(len(TOK), hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    save_model(model, TOK, tmp_path / "ckpt")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    cmd = [sys.executable, "-m", "gspo.interface.cli", "serve", "--model", str(tmp_path / "ckpt"),
           "--model-name", "tiny", "--engine", "vllm", "--port", "0", "--device", "cpu",
           "--max-new-tokens", "6", "--threads", "1"]  # fmt: skip
    log = (tmp_path / "stderr").open("w+")  # vLLM logs a lot: a pipe could fill and block it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        # Printed once it listens; a server that hangs instead fails the test, never blocks it.
        ready, _, _ = select.select([proc.stdout], [], [], 600)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("gspo serve: http://127.0.0.1:"), _tail(log)
        client = openai.OpenAI(base_url=line.split()[2], api_key="any")
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "1+2="}], max_tokens=3
        )
        extra = reply.choices[0].model_extra
        assert 1 <= len(extra["token_ids"]) <= 3
        assert len(reply.choices[0].logprobs.content) == len(extra["token_ids"])
        assert reply.model_extra["prompt_token_ids"][0] == 1  # <bos>: the prompt as served
        done = client.completions.create(model="tiny", prompt=[1, 5, 6])  # token-in
        assert done.choices[0].model_extra["prompt_token_ids"] == [1, 5, 6]
        assert 1 <= len(done.choices[0].model_extra["token_ids"]) <= 6  # --max-new-tokens
        with pytest.raises(openai.BadRequestError, match="n:"):  # parsed by vLLM's request model
            client.chat.completions.create(model="tiny", messages=[], n="x")  # type: ignore[arg-type]
        assert [m.id for m in client.models.list().data] == ["tiny"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(timeout=120) == 0, _tail(log)
        finally:
            if proc.poll() is None:
                proc.kill()


def _tail(log) -> str:
    log.seek(0)
    return log.read()[-3000:]


def test_an_agent_environment_trains_two_steps_with_the_vllm_engine(tmp_path, monkeypatch):
    import gspo.compose.train as trainer_module
    from gspo.config import TrainConfig, build
    from gspo.envs import ENVIRONMENTS

    monkeypatch.setitem(ENVIRONMENTS, "addition", lambda task, opts, chat: ChatAgent())
    # Head size 64 / 2 = 32 (vLLM's CPU attention); --threads 1: the endpoint's worker thread
    # must agree with it (VLLMEngine.generate), or vLLM aborts the process.
    overrides = {"device": "cpu", "threads": 1, "output_dir": str(tmp_path), "task": "addition",
                 "rollout_engine": "vllm", "hidden_size": 64, "num_heads": 2, "num_kv_heads": 1,
                 "max_turns": 3, "max_total_tokens": 48, "steps": 2, "eval_every": 0}  # fmt: skip
    cfg = build(TrainConfig, preset="smoke", overrides=overrides)
    steps = [r for r in trainer_module.train(cfg).history if "reward/mean" in r]
    assert len(steps) == 2
    for record in steps:
        assert record["episode/turns_mean"] == 3 and record["episode/failed"] == 0
        assert record["episode/env_tokens_mean"] > 0 and record["episode/policy_tokens_mean"] > 0
        assert record["time/weight_sync_s"] > 0  # the trained weights reach vLLM
