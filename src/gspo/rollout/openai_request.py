"""What the OpenAI-compatible endpoint reads from a request, and the checks it answers with
HTTP 400 before anything is sampled: caps on ``n`` and ``max_tokens``, the model's context,
token ids outside the vocabulary, messages without content, ``top_logprobs`` (docs/endpoint.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .base import SamplingParams
from .openai_errors import HTTPError

MAX_TOP = 20
"""The most alternatives a request may ask per token (OpenAI's limit)."""


@dataclass(frozen=True)
class Caps:
    """What one request may ask (``gspo serve --max-n``, ``--max-tokens-cap``), and the model's
    context (prompt + ``max_tokens``; None: unchecked)."""

    max_n: int = 64
    max_tokens: int = 4096
    context: int | None = None


@dataclass(frozen=True)
class Asked:
    """A request's sampling: ``n``, the engine's params, the client's explicit ``max_tokens``
    (None: the endpoint's default, clipped to the context), ``seed`` (None: the endpoint's
    random stream) and streaming."""

    n: int
    params: SamplingParams
    max_tokens: int | None
    seed: int | None
    stream: bool
    include_usage: bool
    top: int = 0
    """Alternatives per token asked (``top_logprobs``; completions: ``logprobs``)."""


def read_request(
    body: dict, defaults: SamplingParams, caps: Caps, *, fixed: bool, chat: bool, top: bool
) -> Asked:
    """The sampling ``body`` asks for. ``fixed`` (training): temperature, top-p and seed are
    the run's, a request may only ask fewer tokens than the run's per turn. ``top``: the
    endpoint can answer ``top_logprobs`` (else a request for them is refused)."""
    n = 1 if body.get("n") is None else _int(body["n"], "n")
    if n < 1 or n > caps.max_n:
        raise HTTPError(400, f"n must be in 1..{caps.max_n}, got {n} (gspo serve --max-n)",
                        param="n")  # fmt: skip
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else (
        "max_tokens")  # fmt: skip
    asked = None if body.get(field) is None else _int(body[field], field)
    if asked is not None and asked < 1:
        raise HTTPError(400, f"{field} must be a positive integer, got {asked}", param=field)
    # Training clips a request to the run's tokens per turn instead (fixed).
    if asked is not None and not fixed and asked > caps.max_tokens:
        raise HTTPError(400, f"{field} must be in 1..{caps.max_tokens}, got {asked} (gspo serve "
                        "--max-tokens-cap)", param=field)  # fmt: skip
    max_new = defaults.max_new_tokens
    if asked is not None:
        max_new = min(max_new, asked) if fixed else asked
    alternatives = _top_logprobs(body, chat, top)
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stop):
        raise HTTPError(400, "stop must be a string or a list of non-empty strings", param="stop")
    params = replace(
        defaults, max_new_tokens=max_new, stop_strings=tuple(defaults.stop_strings) + stop
    )
    seed = None if body.get("seed") is None else _int(body["seed"], "seed")
    if seed is not None and not -(1 << 63) <= seed < 1 << 64:  # torch's generator seeds
        raise HTTPError(400, f"seed must be a 64-bit integer, got {seed}", param="seed")
    if not fixed:
        temperature, top_p = body.get("temperature"), body.get("top_p")
        params = replace(
            params,
            temperature=params.temperature if temperature is None else _float(temperature, "temperature"),
            top_p=params.top_p if top_p is None else _float(top_p, "top_p"),
        )  # fmt: skip
        if params.temperature < 0 or not 0 < params.top_p <= 1:
            raise HTTPError(400, "temperature must be >= 0 and top_p in (0, 1]")
    options = body.get("stream_options") or {}
    return Asked(
        n=n,
        params=params,
        max_tokens=None if fixed else asked,
        seed=None if fixed else seed,
        stream=bool(body.get("stream")),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
        top=alternatives,
    )


def _top_logprobs(body: dict, chat: bool, top: bool) -> int:
    """The alternatives per token a request asks (chat: ``top_logprobs``; completions: their
    number in ``logprobs``), at most ``MAX_TOP``. Every choice carries the sampled tokens'
    log-probs; where the endpoint cannot give alternatives (training, the vLLM engine), a
    request for them is refused rather than answered with empty lists."""
    name = "top_logprobs" if chat else "logprobs"
    value = body.get(name)
    if value is None or isinstance(value, bool):  # completions' logprobs: a number; chat: top
        return 0
    k = _int(value, name)
    if not 0 <= k <= MAX_TOP:
        raise HTTPError(400, f"{name} must be in 0..{MAX_TOP}, got {k}", param=name)
    if k and not top:
        raise HTTPError(400, f"{name} > 0 (alternatives per token) is not supported here (the "
                        "torch engine of gspo serve gives them; every choice carries the "
                        "sampled tokens' log-probs): send 0 or leave it out", param=name)  # fmt: skip
    return k


def check_prompt(ids: list[int], asked: Asked, caps: Caps, vocab: int, param: str) -> Asked:
    """``asked`` fitted to the prompt ``ids``: every id in the vocabulary, and prompt +
    completion within the model's context (OpenAI's ``context_length_exceeded``). Without an
    explicit ``max_tokens`` the completion is clipped to what the context leaves."""
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise HTTPError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})",
                        param=param)  # fmt: skip
    context = caps.context
    if context is None:
        return asked
    want = asked.params.max_new_tokens
    if asked.max_tokens is None and len(ids) < context:
        room = min(want, context - len(ids))
        return replace(asked, params=replace(asked.params, max_new_tokens=room))
    if len(ids) + want > context:
        raise HTTPError(
            400,
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{len(ids) + want} tokens ({len(ids)} in the {param}, {want} in the completion). "
            f"Please reduce the length of the {param} or completion.",
            param=param,
            code="context_length_exceeded",
        )
    return asked


def message(m: Any, i: int) -> dict:
    """A chat message as ``{role, content}`` (content parts joined: the text ones)."""
    if not isinstance(m, dict) or "role" not in m:
        raise HTTPError(400, f"messages[{i}] must be an object with a role and content",
                        param=f"messages[{i}]")  # fmt: skip
    content = m.get("content")
    if content is None:
        raise HTTPError(400, f"messages[{i}] has no content", param=f"messages[{i}].content")
    if isinstance(content, list):  # content parts: the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise HTTPError(400, f"messages[{i}].content must be text", param=f"messages[{i}].content")
    return {"role": str(m["role"]), "content": content}


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HTTPError(400, f"{name} must be an integer, got {value!r}", param=name)
    return value


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HTTPError(400, f"{name} must be a number, got {value!r}", param=name)
    return float(value)
