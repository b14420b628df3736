"""Stop strings as token ids, shared by the rollout engines (torch and vLLM): each engine
encodes a stop string once and keeps it."""

from __future__ import annotations

from typing import Any


def encode_stop(tokenizer: Any, cache: dict[str, list[int]], text: str, engine: str) -> list[int]:
    """The token ids of the stop string ``text`` (cached in ``cache``); ``engine`` names the
    engine class in the error when it was built without a tokenizer."""
    if text not in cache:
        if tokenizer is None:
            raise ValueError(f"stop_strings need a tokenizer: {engine}(..., tokenizer=tok)")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"stop string {text!r} encodes to no tokens")
        cache[text] = list(ids)
    return cache[text]


def first_stop(ids: list[int], stop_seqs: list[list[int]]) -> int | None:
    """Length of the shortest prefix of ``ids`` that ends with one of ``stop_seqs``, if any
    (the vLLM engine cuts its completions there)."""
    for end in range(1, len(ids) + 1):
        for seq in stop_seqs:
            k = len(seq)
            if end >= k and ids[end - k : end] == seq:
                return end
    return None
