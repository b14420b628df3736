"""vLLM's OpenAI protocol types for the endpoint over the vLLM engine (docs/endpoint.md).

With ``--engine vllm`` the endpoint (:class:`gspo.rollout.openai_server.OpenAIEndpoint`) parses
every request with vLLM's own request models (``ChatCompletionRequest``, ``CompletionRequest``)
and builds every response, error and model list with vLLM's response models, so clients see
what ``vllm serve`` would answer. Sampling still goes through gspo's engine
(``VLLMEngine.generate``, batched in rounds): the token-in/token-out records, the deterministic
rounds and the weight syncs stay gspo's, which vLLM's own server would not give.

Only the fields the endpoint honours are read from a parsed request, and only when the client
set them (vLLM's defaults, e.g. ``max_tokens`` 16 for completions, would otherwise replace the
run's). Imported only when an endpoint serves a vLLM engine (vLLM is already loaded then).
"""

from __future__ import annotations

import warnings
from typing import Any

from .openai_errors import HTTPError

READ = ("messages", "prompt", "n", "max_tokens", "max_completion_tokens", "temperature",
        "top_p", "stop", "stream", "stream_options", "seed", "logprobs", "top_logprobs")  # fmt: skip
"""The request fields the endpoint honours (the rest are validated by vLLM, then ignored)."""


def protocol_for(engine: Any) -> VLLMProtocol | None:
    """vLLM's protocol types for an engine that says it is vLLM's (``openai_protocol ==
    "vllm"``: :class:`gspo.rollout.vllm_engine.VLLMEngine`), else None (gspo's own dicts)."""
    return VLLMProtocol() if getattr(engine, "openai_protocol", None) == "vllm" else None


def _types() -> dict[str, Any]:
    """vLLM's protocol classes by name: vLLM 0.32 keeps them per route (``openai.chat_completion
    .protocol``, ``openai.completion.protocol``, ``serve.engine.protocol``); older releases in
    one module, ``vllm.entrypoints.openai.protocol``."""
    names = {
        "chat_completion": ("ChatCompletionRequest", "ChatCompletionResponse",
                            "ChatCompletionResponseChoice", "ChatMessage",
                            "ChatCompletionLogProbs", "ChatCompletionLogProbsContent"),
        "completion": ("CompletionRequest", "CompletionResponse", "CompletionResponseChoice",
                       "CompletionLogProbs"),
        "engine": ("UsageInfo", "ModelCard", "ModelList", "ErrorResponse", "ErrorInfo"),
    }  # fmt: skip
    import importlib

    found: dict[str, Any] = {}
    for part, classes in names.items():
        where = "serve.engine" if part == "engine" else f"openai.{part}"
        try:
            module = importlib.import_module(f"vllm.entrypoints.{where}.protocol")
        except ImportError:
            module = importlib.import_module("vllm.entrypoints.openai.protocol")
        for name in classes:
            found[name] = getattr(module, name, None)
    if found["ErrorInfo"] is None:  # before vLLM 0.11: the error fields on ErrorResponse
        found["ErrorInfo"] = dict
    return found


class VLLMProtocol:
    """Requests parsed and responses built with vLLM's protocol types."""

    name = "vllm"

    def __init__(self) -> None:
        self.t = _types()

    def request(self, kind: str, body: dict) -> dict:
        """``body`` validated by vLLM's request model of ``kind`` ("chat" or "completion"),
        as the plain fields the endpoint reads (those the client set)."""
        from pydantic import ValidationError

        model = self.t["ChatCompletionRequest" if kind == "chat" else "CompletionRequest"]
        body = {"model": "", **body}  # vLLM requires no model here either; gspo accepts any
        try:
            with warnings.catch_warnings():  # max_tokens: "deprecated" in chat; still honoured
                warnings.simplefilter("ignore", DeprecationWarning)
                req = model.model_validate(body)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "request"
            raise HTTPError(400, f"{where}: {first.get('msg', 'invalid')}") from None
        except ValueError as err:  # vLLM's own checks in its validators
            raise HTTPError(400, str(err).splitlines()[0]) from None
        set_ = req.model_fields_set
        read = {name: getattr(req, name) for name in READ if name in set_ and name in body}
        if hasattr(read.get("stream_options"), "model_dump"):  # vLLM's StreamOptions
            read["stream_options"] = read["stream_options"].model_dump()
        return read

    def chat(self, d: dict) -> dict:
        t = self.t
        choices = [
            t["ChatCompletionResponseChoice"](
                index=c["index"],
                message=t["ChatMessage"](**c["message"]),
                logprobs=t["ChatCompletionLogProbs"](
                    content=[
                        t["ChatCompletionLogProbsContent"](**x) for x in c["logprobs"]["content"]
                    ]
                ),
                finish_reason=c["finish_reason"],
                token_ids=c["token_ids"],
            )
            for c in d["choices"]
        ]
        return self._dump(t["ChatCompletionResponse"], d, choices)

    def completion(self, d: dict) -> dict:
        t = self.t
        choices = []
        for c in d["choices"]:
            lp = c["logprobs"]
            offsets, at = [], 0
            for piece in lp["tokens"]:  # where each token's text starts in the completion
                offsets.append(at)
                at += len(piece)
            logprobs = t["CompletionLogProbs"](
                text_offset=offsets,
                token_logprobs=lp["token_logprobs"],
                tokens=lp["tokens"],
                top_logprobs=[None] * len(lp["tokens"]),
            )
            choices.append(
                t["CompletionResponseChoice"](
                    index=c["index"],
                    text=c["text"],
                    logprobs=logprobs,
                    finish_reason=c["finish_reason"],
                    token_ids=c["token_ids"],
                    prompt_token_ids=c["prompt_token_ids"],
                )
            )
        # prompt_token_ids also on the response (an extra field, as gspo's own endpoint has it).
        return self._dump(t["CompletionResponse"], d, choices)

    def _dump(self, model: Any, d: dict, choices: list) -> dict:
        usage = self.t["UsageInfo"](**d["usage"])
        response = model(
            id=d["id"],
            created=d["created"],
            model=d["model"],
            choices=choices,
            usage=usage,
            prompt_token_ids=d["prompt_token_ids"],
        )
        return response.model_dump(mode="json")

    def models(self, d: dict) -> dict:
        cards = [self.t["ModelCard"](**entry) for entry in d["data"]]
        return self.t["ModelList"](data=cards).model_dump(mode="json")

    def error(self, status: int, message: str, kind: str, param: str | None = None) -> dict:
        """vLLM's ErrorResponse: the HTTP status as ``code``, as ``vllm serve`` answers."""
        info = self.t["ErrorInfo"](message=message, type=kind, param=param, code=status)
        if isinstance(info, dict):
            return self.t["ErrorResponse"](object="error", **info).model_dump(mode="json")
        return self.t["ErrorResponse"](error=info).model_dump(mode="json")
