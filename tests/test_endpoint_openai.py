"""The endpoint (gspo.rollout.openai_server) as the official ``openai`` client sees it: seeds,
end tokens and stop strings out of the text, the checks answered with HTTP 400 in OpenAI's
error shape (token ids, context, caps, content, top_logprobs), 404 in the same shape, and
``stream: true`` as server-sent events that join to the non-streamed answer."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest
import torch

pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
httpx = pytest.importorskip("httpx", reason="the endpoint tests call it with httpx")
openai = pytest.importorskip("openai", reason="these tests use the official openai client")

from endpoint_support import TEMPERATURE, TOK, float64_policy  # noqa: E402

from gspo.envs.trajectory import PlainEncoder  # noqa: E402
from gspo.models.char_tokenizer import EOS_ID  # noqa: E402
from gspo.rollout import Rollout, SamplingParams  # noqa: E402
from gspo.rollout.openai_request import Caps  # noqa: E402
from gspo.rollout.openai_server import OpenAIEndpoint, ServerThread  # noqa: E402
from gspo.rollout.openai_top import locked, top_logprobs_for  # noqa: E402
from gspo.rollout.request_batcher import RequestBatcher  # noqa: E402

PARAMS = SamplingParams(temperature=TEMPERATURE, max_new_tokens=8)
CAPS = Caps(max_n=4, max_tokens=64, context=256)  # the tiny model's 256 positions
HI = [{"role": "user", "content": "12+3="}]


def serve(engine) -> ServerThread:
    """The endpoint over ``engine``; a torch engine's also answers ``top_logprobs``."""
    lock = threading.Lock()
    batcher = RequestBatcher(locked(engine.generate, lock),
                             generator=torch.Generator().manual_seed(0))  # fmt: skip
    endpoint = OpenAIEndpoint(batcher, PlainEncoder(TOK), "tiny", PARAMS, caps=CAPS,
                              top_logprobs=top_logprobs_for(engine, lock))  # fmt: skip
    return ServerThread(endpoint).start()  # 127.0.0.1, a free port


@pytest.fixture(scope="module")
def server():
    _, engine = float64_policy()
    srv = serve(engine)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url(), api_key="any", max_retries=0)


def ids_of(reply) -> list[list[int]]:
    return [c.model_extra["token_ids"] for c in reply.choices]


def test_the_same_seed_gives_the_same_completion(client):
    def ask(seed: int):
        return client.chat.completions.create(
            model="tiny", messages=HI, temperature=1.0, seed=seed, n=2
        )

    first, again = ask(123), ask(123)
    assert ids_of(first) == ids_of(again)
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    # Another seed, other samples (8 tokens of a 1.0-temperature random model: the same ids
    # for 4 other seeds would be a broken seed, not chance).
    assert any(ids_of(ask(seed)) != ids_of(first) for seed in (1, 2, 3, 4))


class FixedEngine:
    """Answers every prompt with "4", "2", "+", "1", <eos> (finish "stop"; log-prob -1 each)."""

    ids: ClassVar[list[int]] = [*TOK("42+1", add_special_tokens=False)["input_ids"], EOS_ID]

    def generate(self, request):
        prompts, n = request.prompts, request.n
        rows = len(prompts) * n
        ids = torch.tensor([self.ids] * rows)  # [N, 5]
        return Rollout(
            prompt_ids=torch.ones((rows, 1), dtype=torch.long),
            prompt_mask=torch.ones((rows, 1), dtype=torch.long),
            completion_ids=ids,
            completion_mask=torch.ones_like(ids),
            logprobs=-torch.ones(ids.shape),
            finish_reasons=["stop"] * rows,
            prompt_index=torch.arange(rows) // n,
        )


def test_the_end_token_and_stop_strings_are_not_text_but_their_ids_are_returned():
    srv = serve(FixedEngine())
    try:
        client = openai.OpenAI(base_url=srv.url(), api_key="any", max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=HI)
        choice = reply.choices[0]
        assert choice.message.content == "42+1" and choice.finish_reason == "stop"
        assert [x.token for x in choice.logprobs.content] == ["4", "2", "+", "1"]  # no <eos>
        assert choice.model_extra["token_ids"] == FixedEngine.ids  # gspo's fields: all of it
        assert choice.model_extra["token_logprobs"] == [-1.0] * 5
        # A stop string and what follows it are not text either (OpenAI's and vLLM's answer).
        reply = client.chat.completions.create(model="tiny", messages=HI, stop=["+"])
        choice = reply.choices[0]
        assert choice.message.content == "42"
        assert [x.token for x in choice.logprobs.content] == ["4", "2"]
        assert choice.model_extra["token_ids"] == FixedEngine.ids
        done = client.completions.create(model="tiny", prompt="1", stop="2")
        assert done.choices[0].text == "4" and done.choices[0].logprobs.tokens == ["4"]
        assert done.choices[0].model_extra["token_logprobs"] == [-1.0] * 5
        # An engine without a model to score alternatives with: top_logprobs refused.
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny", messages=HI, logprobs=True,
                                           top_logprobs=2)  # fmt: skip
        assert err.value.body["param"] == "top_logprobs"
    finally:
        srv.stop()


def refused(call, status: int = 400) -> dict:
    """The OpenAI error object of a refused call (the client raises on it)."""
    with pytest.raises(openai.APIStatusError) as err:
        call()
    assert err.value.status_code == status
    body = err.value.body
    assert set(body) == {"message", "type", "param", "code"}  # OpenAI's error object
    return body


def test_bad_requests_get_400_in_openai_error_shape(client):
    for ids in ([1, 5, len(TOK)], [1, -3]):  # outside the vocabulary: 400, not 500
        error = refused(lambda ids=ids: client.completions.create(model="tiny", prompt=ids))
        assert "outside the vocabulary" in error["message"] and error["param"] == "prompt"
    error = refused(lambda: client.completions.create(model="tiny", prompt=[5] * 300))
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in error["message"]
    long = [{"role": "user", "content": "1" * 250}]  # 251 prompt tokens + 8 > 256
    error = refused(lambda: client.chat.completions.create(model="tiny", messages=long,
                                                           max_tokens=8))  # fmt: skip
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    # Without max_tokens, the completion is clipped to what the context leaves.
    reply = client.chat.completions.create(model="tiny", messages=long)
    assert len(reply.choices[0].model_extra["token_ids"]) <= 256 - 251
    error = refused(lambda: client.chat.completions.create(model="tiny", messages=HI, n=5))
    assert error["param"] == "n" and "1..4" in error["message"]
    error = refused(lambda: client.chat.completions.create(model="tiny", messages=HI,
                                                           max_tokens=65))  # fmt: skip
    assert error["param"] == "max_tokens" and "1..64" in error["message"]
    error = refused(lambda: client.chat.completions.create(model="tiny",
                                                           messages=[{"role": "user"}]))  # fmt: skip
    assert error["param"] == "messages[0].content"
    error = refused(lambda: client.chat.completions.create(
        model="tiny", messages=HI, logprobs=True, top_logprobs=21))  # fmt: skip
    assert error["param"] == "top_logprobs" and "0..20" in error["message"]


def test_top_logprobs_are_the_models_most_likely_tokens_at_each_sampled_position(client):
    for temperature in (0, 0.7):
        reply = client.chat.completions.create(model="tiny", messages=HI, logprobs=True,
                                               top_logprobs=3, temperature=temperature)  # fmt: skip
        content = reply.choices[0].logprobs.content
        assert content
        for entry in content:
            top = [x.logprob for x in entry.top_logprobs]
            assert len(top) == 3 and top == sorted(top, reverse=True)
            assert entry.logprob <= top[0] + 1e-9
            if temperature == 0:  # greedy: the sampled token is the most likely one
                assert entry.top_logprobs[0].token == entry.token
                assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-9  # float64
    done = client.completions.create(model="tiny", prompt="7+8=", logprobs=2, temperature=0)
    lp = done.choices[0].logprobs
    assert [len(alts) for alts in lp.top_logprobs] == [2] * len(lp.tokens)
    assert all(max(alts.values()) == pytest.approx(x) for alts, x in
               zip(lp.top_logprobs, lp.token_logprobs, strict=True))  # fmt: skip
    # Without them: the sampled tokens' log-probs, which every choice carries.
    reply = client.chat.completions.create(model="tiny", messages=HI, logprobs=True,
                                           top_logprobs=0)  # fmt: skip
    assert reply.choices[0].logprobs.content[0].top_logprobs == []


def test_unknown_routes_and_episodes_answer_404_in_openai_error_shape(client, server):
    error = refused(lambda: client.get("/nothing/here", cast_to=object), 404)
    assert error["type"] == "not_found_error" and "/v1/nothing/here" in error["message"]
    got = httpx.post(server.url("nobody") + "/completions", json={"prompt": "1"})
    assert got.status_code == 404 and set(got.json()["error"]) == {"message", "type", "param",
                                                                   "code"}  # fmt: skip
    got = httpx.get(server.url() + "/chat/completions")  # a known route, the wrong method
    assert got.status_code == 405 and got.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("asks", [{"temperature": 0}, {"temperature": 1.0, "seed": 7, "n": 2}],
                         ids=["greedy", "seeded"])  # fmt: skip
def test_a_streamed_answer_joins_to_the_non_streamed_one(client, asks):
    whole = client.chat.completions.create(model="tiny", messages=HI, **asks)
    n = len(whole.choices)
    text, ids, lps = [""] * n, [[] for _ in range(n)], [[] for _ in range(n)]
    finish, usage, prompt = [None] * n, None, None
    stream = client.chat.completions.create(
        model="tiny", messages=HI, stream=True, stream_options={"include_usage": True}, **asks
    )
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        prompt = prompt or (chunk.model_extra or {}).get("prompt_token_ids")
        usage = chunk.usage or usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            ids[c.index] += (c.model_extra or {}).get("token_ids", [])
            lps[c.index] += (c.model_extra or {}).get("token_logprobs", [])
            finish[c.index] = c.finish_reason or finish[c.index]
    assert text == [c.message.content for c in whole.choices]
    assert ids == ids_of(whole)
    assert lps == [c.model_extra["token_logprobs"] for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]
    assert prompt == whole.model_extra["prompt_token_ids"]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_streamed_completions_join_to_the_non_streamed_text(client):
    whole = client.completions.create(model="tiny", prompt="7+8=", temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt="7+8=", temperature=0,
                                            stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    joined = [t for c in chunks for t in c.choices[0].model_extra.get("token_ids", [])]
    assert joined == whole.choices[0].model_extra["token_ids"]
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
