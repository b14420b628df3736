"""An OpenAI-compatible HTTP endpoint over any rollout engine (FastAPI + uvicorn, extra ``serve``).

Routes, at the top level and under an episode's prefix ``/episodes/<id>`` (training gives each
agent episode its own base URL; see docs/endpoint.md):
* ``POST /v1/chat/completions``: ``messages`` rendered with the run's chat template (or, for
  tokenizers without one, their contents concatenated);
* ``POST /v1/completions``: ``prompt`` as text or as a list of token ids (token-in);
* ``GET /v1/models``.

Responses are OpenAI-shaped; every choice carries ``logprobs`` (the engine's log-prob of each
sampled token, the engine contract's convention: temperature-scaled, before top-p) and vLLM's
extension fields: ``token_ids`` (the sampled ids) on each choice and ``prompt_token_ids`` (the
prompt as the engine saw it) on the response and on each completions choice.

Token-in, token-out chat: when a chat request repeats an earlier conversation of the same scope
(episode, or the top level) plus the assistant message it was answered with, the prompt is the
earlier prompt + completion token ids as sampled, followed by only the new messages' tokens
(``encoder.reply_ids``, :class:`gspo.envs.trajectory.ChatEncoder`); sampled text is never
re-tokenized. Requests are batched into ``engine.generate`` rounds by
:class:`~gspo.rollout.request_batcher.RequestBatcher`; a request with a ``seed`` gets a
``generate`` call of its own with a generator seeded by it (the same seed and request give the
same completion). ``stream: true`` answers the finished completion as server-sent events
(:mod:`gspo.rollout.openai_stream`). Requests are checked first (:mod:`.openai_request`).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Protocol

from .base import SamplingParams
from .openai_errors import EpisodeLimit, HTTPError, error_body
from .openai_request import Asked, Caps, check_prompt, message, read_request
from .openai_stream import chunks, server_sent_events, visible
from .request_batcher import RequestBatcher, Sample

INSTALL_HINT = 'the endpoint needs FastAPI and uvicorn: pip install "gspo[serve]"'
CACHE = 64
"""Conversations remembered per scope for token-in, token-out chat continuation."""


class EpisodeHooks(Protocol):
    """What the agent driver checks and records for each request of an episode."""

    def admit(self, episode: str, prompt: list[int], max_new: int) -> int:
        """The tokens this request may sample (at most ``max_new``); raises
        :class:`EpisodeLimit` past a limit and KeyError for an unknown episode."""
        ...

    def record(self, episode: str, prompt: list[int], sample: Sample) -> None:
        """Keep one sampled completion of the episode."""
        ...


class OpenAIEndpoint:
    """The endpoint's logic, apart from the HTTP framework (``app()`` builds the FastAPI app).

    ``defaults``: the sampling of every request that does not set its own (``stop_token_ids``:
    the chat end tokens, always applied). ``fixed``: training; requests cannot change the
    temperature, top-p or seed (the recorded log-probs must be the run's, and the ``n``
    episodes of an example need different samples), only ask fewer tokens. ``caps``: what one
    request may ask, and the model's context.
    """

    def __init__(
        self,
        batcher: RequestBatcher,
        encoder: Any,
        model_name: str,
        defaults: SamplingParams,
        *,
        fixed: bool = False,
        episodes: EpisodeHooks | None = None,
        protocol: Any = None,
        caps: Caps | None = None,
        top_logprobs: Callable[..., list] | None = None,
    ) -> None:
        self.batcher = batcher
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.model_name = model_name
        self.defaults = defaults
        self.fixed = fixed
        self.episodes = episodes
        self.caps = caps or Caps()
        # top_logprobs(prompt, completion, k, temperature): the alternatives per token
        # (:mod:`.openai_top`, the torch engine of gspo serve); None: refused with 400.
        self.top = top_logprobs
        # Ends a completion may have that are not text (OpenAI answers without them).
        eos = self.tokenizer.eos_token_id
        self._ends = set(defaults.stop_token_ids) | ({eos} if eos is not None else set())
        # vLLM's protocol types (rollout/openai_vllm.py: protocol_for(engine)) or None: gspo's
        # own dicts. The same fields either way; only parsing and serializing differ.
        self.protocol = protocol
        self._chats: dict[str | None, list[tuple[list[dict], list[int], list[int]]]] = {}
        self._ids = itertools.count()

    # -- requests ----------------------------------------------------------------------------
    async def _sample(
        self, episode: str | None, prompt: list[int], asked: Asked, param: str
    ) -> list[Sample]:
        asked = check_prompt(prompt, asked, self.caps, len(self.tokenizer), param)
        n, params = asked.n, asked.params
        if episode is not None:
            if self.episodes is None:
                raise HTTPError(404, f"no episode {episode!r}: this endpoint runs no episodes",
                                "not_found_error")  # fmt: skip
            try:
                room = self.episodes.admit(episode, prompt, params.max_new_tokens * n)
            except KeyError:
                raise HTTPError(404, f"no live episode {episode!r}", "not_found_error") from None
            except EpisodeLimit as err:
                raise HTTPError(400, str(err), "episode_limit", code="episode_limit") from None
            params = replace(params, max_new_tokens=max(1, min(params.max_new_tokens, room // n)))
        try:
            samples = await self.batcher.submit(episode, prompt, n, params, seed=asked.seed)
        except ValueError as err:  # e.g. a prompt longer than the model's context
            raise HTTPError(400, str(err)) from None
        if episode is not None and self.episodes is not None:
            for s in samples:
                self.episodes.record(episode, prompt, s)
        return samples

    def read(self, kind: str, body: dict) -> tuple[dict, Asked]:
        """``body`` parsed (by vLLM's request models with the vLLM protocol) and its sampling."""
        if self.protocol is not None:
            body = self.protocol.request(kind, body)
        asked = read_request(body, self.defaults, self.caps, fixed=self.fixed,
                             chat=kind == "chat", top=self.top is not None)  # fmt: skip
        return body, asked

    async def _alternatives(self, prompt: list[int], s: Sample, asked: Asked, shown: int):
        """Per text token of ``s``: its ``asked.top`` most likely tokens (id, log-prob)."""
        if not asked.top or self.top is None:
            return [[] for _ in range(shown)]
        args = (prompt, s.ids[:shown], asked.top, asked.params.temperature)
        return await asyncio.to_thread(self.top, *args)

    async def completions(self, episode: str | None, body: dict) -> dict | Iterator[str]:
        body, asked = self.read("completion", body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            ids = list(prompt)
        else:
            raise HTTPError(400, "prompt must be a string or a non-empty list of token ids",
                            param="prompt")  # fmt: skip
        samples = await self._sample(episode, ids, asked, "prompt")
        choices = []
        for i, s in enumerate(samples):
            shown, text = self._visible(s, asked)
            tokens = [self.tokenizer.decode([t]) for t in s.ids[:shown]]
            alts = await self._alternatives(ids, s, asked, shown)
            top = [{self.tokenizer.decode([t]): lp for t, lp in a} for a in alts]
            choices.append(
                {
                    "index": i,
                    "text": text,
                    "finish_reason": s.finish,
                    "logprobs": {
                        "tokens": tokens,
                        "token_logprobs": s.logprobs[:shown],
                        "top_logprobs": top if asked.top else None,
                        "text_offset": _offsets(tokens),
                    },
                    "token_ids": s.ids,
                    "prompt_token_ids": ids,
                }
            )
        response = self._response("text_completion", "cmpl", ids, samples, choices)
        if self.protocol is not None:
            response = self.protocol.completion(response)
        return self._answer(_with_logprobs(response, samples), asked)

    async def chat(self, episode: str | None, body: dict) -> dict | Iterator[str]:
        body, asked = self.read("chat", body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPError(400, "messages must be a non-empty list of {role, content} objects",
                            param="messages")  # fmt: skip
        messages = [message(m, i) for i, m in enumerate(messages)]
        try:
            ids = self._chat_prompt(episode, messages)
        except ValueError as err:  # a template that cannot be applied incrementally
            raise HTTPError(400, str(err), param="messages") from None
        samples = await self._sample(episode, ids, asked, "messages")
        choices = []
        for i, s in enumerate(samples):
            shown, text = self._visible(s, asked)
            conv = [*messages, {"role": "assistant", "content": text}]
            self._remember(episode, conv, ids + s.ids, s.ids)
            alts = await self._alternatives(ids, s, asked, shown)
            # The text tokens only (alts has one entry per text token).
            entries = [self._logprob(t, lp, a) for (t, lp), a in zip(_pairs(s), alts, strict=False)]
            choices.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": s.finish,
                    "logprobs": {"content": entries},
                    "token_ids": s.ids,
                }
            )
        response = self._response("chat.completion", "chatcmpl", ids, samples, choices)
        if self.protocol is not None:
            response = self.protocol.chat(response)
        return self._answer(_with_logprobs(response, samples), asked)

    def _visible(self, s: Sample, asked: Asked) -> tuple[int, str]:
        return visible(self.tokenizer, s.ids, s.finish, self._ends, asked.params.stop_strings)

    def _answer(self, response: dict, asked: Asked) -> dict | Iterator[str]:
        """The response, or with ``stream: true`` its server-sent events."""
        if not asked.stream:
            return response
        return server_sent_events(chunks(response, self.tokenizer, asked.include_usage))

    def models(self) -> dict:
        entry = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "gspo"}
        listed = {"object": "list", "data": [entry]}
        return listed if self.protocol is None else self.protocol.models(listed)

    def error(self, err: HTTPError) -> dict:
        """The body of an error answer: ``{"error": {"message", "type", "param", "code"}}``."""
        if self.protocol is not None:
            return self.protocol.error(err.status, err.message, err.kind, err.param)
        return error_body(err.message, err.kind, err.param, err.code)

    # -- chat prompts ------------------------------------------------------------------------
    def _chat_prompt(self, scope: str | None, messages: list[dict]) -> list[int]:
        """Token ids of ``messages``: a remembered conversation's exact ids + the new messages'
        tokens when ``messages`` continues one, else the whole conversation rendered."""
        for conv, ids, last in reversed(self._chats.get(scope, [])):
            k = len(conv)
            if len(messages) > k and _same(messages[:k], conv):
                return ids + self.encoder.reply_ids(conv, last, messages[k:])
        if self.encoder.chat:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        text = "".join(m["content"] for m in messages)
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def _remember(self, scope: str | None, conv: list[dict], ids: list[int], last: list[int]):
        kept = self._chats.setdefault(scope, [])
        kept.append((conv, ids, last))
        del kept[:-CACHE]

    def forget(self, scope: str) -> None:
        self._chats.pop(scope, None)

    # -- responses ---------------------------------------------------------------------------
    def _logprob(self, token: int, logprob: float, alternatives=()) -> dict:
        """A chat ``logprobs.content`` entry (``alternatives``: (id, log-prob) pairs)."""
        top = [self._entry(t, lp) for t, lp in alternatives]
        return {**self._entry(token, logprob), "top_logprobs": top}

    def _entry(self, token: int, logprob: float) -> dict:
        piece = self.tokenizer.decode([token])
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}

    def _response(self, obj: str, prefix: str, ids, samples, choices) -> dict:
        sampled = sum(len(s.ids) for s in samples)
        return {
            "id": f"{prefix}-{next(self._ids)}",
            "object": obj,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": sampled,
                "total_tokens": len(ids) + sampled,
            },
            "prompt_token_ids": ids,
        }

    def app(self):
        """The FastAPI application serving this endpoint."""
        try:  # FastAPI is the optional extra ``serve``: loaded only when the endpoint starts
            from .openai_app import build_app
        except ImportError as err:
            raise ImportError(INSTALL_HINT) from err
        return build_app(self)


class ServerThread:
    """Serves an :class:`OpenAIEndpoint` with uvicorn in a thread of its own (its own event
    loop; the batcher's round loop runs there too). ``port`` 0: a free port, read back as
    ``.port`` once started."""

    def __init__(self, endpoint: OpenAIEndpoint, host: str = "127.0.0.1", port: int = 0):
        try:
            import uvicorn
        except ImportError as err:
            raise ImportError(INSTALL_HINT) from err
        config = uvicorn.Config(endpoint.app(), host=host, port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.endpoint = endpoint
        self.host = host
        self.port = port
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="gspo-endpoint", daemon=True)

    def _main(self) -> None:
        async def main():
            rounds = asyncio.create_task(self.endpoint.batcher.run())
            try:
                await self.server.serve()
            finally:
                rounds.cancel()

        try:
            asyncio.run(main())
        except BaseException as err:  # reported by start()
            self._error = err

    def start(self, timeout_s: float = 60.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the endpoint did not start on {self.host}:{self.port}: "
                                   f"{self._error or 'the server exited'}")  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint did not start within {timeout_s:.0f} s")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def url(self, episode: str | None = None) -> str:
        """The OpenAI base URL (ending in /v1), of ``episode`` when given."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        scope = f"/episodes/{episode}" if episode else ""
        return f"http://{host}:{self.port}{scope}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


def _offsets(tokens: list[str]) -> list[int]:
    """Where each token's text starts in the completion."""
    out, at = [], 0
    for piece in tokens:
        out.append(at)
        at += len(piece)
    return out


def _with_logprobs(response: dict, samples: list[Sample]) -> dict:
    """gspo's ``token_logprobs`` on each choice: the log-prob of every id in ``token_ids``
    (the end token and stop string included, which the OpenAI ``logprobs`` leave out)."""
    for choice, s in zip(response["choices"], samples, strict=True):
        choice["token_logprobs"] = s.logprobs
    return response


def _same(asked: list[dict], conv: list[dict]) -> bool:
    """``asked`` repeats ``conv`` (the assistant turns compared without surrounding spaces:
    clients may strip them)."""
    for a, c in zip(asked, conv, strict=True):
        if a["role"] != c["role"]:
            return False
        if a["content"] != c["content"] and not (
            a["role"] == "assistant" and a["content"].strip() == c["content"].strip()
        ):
            return False
    return True


def _pairs(s: Sample):
    return zip(s.ids, s.logprobs, strict=True)
