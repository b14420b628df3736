"""The text an OpenAI client sees of a sampled completion, and ``stream: true`` answers.

* :func:`visible`: a completion's text without its end token or stop string, as OpenAI and
  vLLM answer it (the ids and log-probs of every sampled token stay in gspo's fields).
* :func:`chunks`: a finished response as the server-sent-event chunks vLLM streams
  (``chat.completion.chunk`` / ``text_completion``). The engine samples whole completions in
  rounds, so the chunks are sent once the completion is done: a client that streams gets the
  same text, split per token, with each token's id and log-prob on its chunk.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def visible(
    tokenizer: Any, ids: list[int], finish: str, ends: set[int], stops: Iterable[str]
) -> tuple[int, str]:
    """(how many leading tokens of ``ids`` are text, the text): a final end token (``ends``)
    and, after a stop string, the string and what follows it are not text."""
    k = len(ids)
    if finish == "stop" and k and ids[-1] in ends:
        k -= 1
    text = tokenizer.decode(ids[:k], skip_special_tokens=True)
    if finish != "stop":
        return k, text
    cut = min((at for at in (text.find(s) for s in stops if s) if at >= 0), default=-1)
    if cut < 0:
        return k, text
    text = text[:cut]
    while k and len(tokenizer.decode(ids[:k], skip_special_tokens=True)) > cut:
        k -= 1  # a token that reaches into the stop string is not a text token
    return k, text


def pieces(tokenizer: Any, ids: list[int], shown: int, text: str) -> list[str]:
    """The text each token of ``ids`` adds (its first ``shown`` are text tokens; the others
    add nothing). Joined they are ``text`` exactly: a token whose bytes end inside a character
    waits for the next, and what the last text token leaves goes with it."""
    out, sent = [""] * len(ids), 0
    for k in range(1, shown + 1):
        upto = tokenizer.decode(ids[:k], skip_special_tokens=True)
        if upto.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its end
            continue
        end = min(len(upto), len(text))
        if end > sent:
            out[k - 1], sent = text[sent:end], end
    if sent < len(text) and out:
        out[max(shown, 1) - 1] += text[sent:]
    return out


def chunks(response: dict, tokenizer: Any, include_usage: bool) -> Iterator[dict]:
    """``response`` (a chat or completions answer of the endpoint) as vLLM's stream chunks:
    per choice, one chunk per sampled token (its text delta, its ``logprobs`` entry when it is
    a text token, and gspo's ``token_ids`` / ``token_logprobs`` of that token), then one with
    the ``finish_reason``; the first chunk carries ``prompt_token_ids``, and with
    ``stream_options.include_usage`` a last chunk carries ``usage`` (``choices`` empty)."""
    chat = response["object"] == "chat.completion"
    head = {
        "id": response["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response["created"],
        "model": response["model"],
    }
    first = {"prompt_token_ids": response.get("prompt_token_ids")}
    for c in response["choices"]:
        i, ids, lps = c["index"], c["token_ids"], c["token_logprobs"]
        if chat:
            text, shown = c["message"]["content"] or "", c["logprobs"]["content"]
            yield {**head, **first, "choices": [{"index": i, "logprobs": None,
                   "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}  # fmt: skip
            first = {}
        else:
            text, shown = c["text"], _completion_entries(c["logprobs"])
        for j, piece in enumerate(pieces(tokenizer, ids, len(shown), text)):
            entry = shown[j] if j < len(shown) else None
            choice = {"index": i, "finish_reason": None, "token_ids": [ids[j]],
                      "token_logprobs": [lps[j]]}  # fmt: skip
            if chat:
                choice["delta"] = {"content": piece}
                choice["logprobs"] = None if entry is None else {"content": [entry]}
            else:
                choice["text"] = piece
                choice["logprobs"] = None if entry is None else {
                    key: [value] for key, value in entry.items()}  # fmt: skip
            yield {**head, **first, "choices": [choice]}
            first = {}
        end = {"index": i, "logprobs": None, "finish_reason": c["finish_reason"]}
        end.update({"delta": {}} if chat else {"text": ""})
        yield {**head, **first, "choices": [end]}
        first = {}
    if include_usage:
        yield {**head, "choices": [], "usage": response["usage"]}


def _completion_entries(logprobs: dict) -> list[dict]:
    """A completions choice's ``logprobs`` (lists per field) as one entry per text token."""
    tokens = logprobs.get("tokens") or []
    offsets = logprobs.get("text_offset") or [None] * len(tokens)
    return [
        {"tokens": t, "token_logprobs": lp, "top_logprobs": None, "text_offset": off}
        for t, lp, off in zip(tokens, logprobs["token_logprobs"], offsets, strict=True)
    ]


def server_sent_events(stream: Iterable[dict]) -> Iterator[str]:
    """``data: {chunk}`` events, then ``data: [DONE]``, as OpenAI and vLLM end a stream."""
    for chunk in stream:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
