"""``top_logprobs`` of ``gspo serve`` over the torch engine: the most likely tokens at each
sampled position, from one forward pass of the engine's model over prompt + completion.

The engine samples with its KV cache and records only the sampled token's log-prob; the
alternatives come from this second pass over the same weights, under the engine contract's
convention (``log_softmax(logits / temperature)``, temperature 0 read as 1), so the sampled
token's entry equals its recorded log-prob up to float rounding. The pass and the engine's
rounds share a lock: the model runs one of them at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .torch_engine import TorchEngine


class TopLogprobs:
    """``top(prompt, completion, k, temperature)``: per completion token, its ``k`` most likely
    tokens as (id, log-prob), most likely first."""

    def __init__(self, model: torch.nn.Module, lock: threading.Lock) -> None:
        self.model = model
        self.lock = lock

    def __call__(
        self, prompt: list[int], completion: list[int], k: int, temperature: float
    ) -> list[list[tuple[int, float]]]:
        if not completion:
            return []
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt + completion], device=device)  # [1, P + L]
        with self.lock, torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0]  # [P + L, V]
        at = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]  # [L, V]
        t = 1.0 if temperature == 0 else float(temperature)
        logp = torch.log_softmax(at.double() / t, dim=-1)  # [L, V]
        values, index = logp.topk(min(k, logp.shape[-1]), dim=-1)  # [L, k]
        return [
            list(zip(i, v, strict=True))
            for i, v in zip(index.tolist(), values.tolist(), strict=True)
        ]


def top_logprobs_for(engine: Any, lock: threading.Lock) -> TopLogprobs | None:
    """The scorer of a torch engine's model, else None (the vLLM engine: the endpoint then
    refuses ``top_logprobs`` with HTTP 400)."""
    return TopLogprobs(engine.model, lock) if isinstance(engine, TorchEngine) else None


def locked(generate: Callable, lock: threading.Lock) -> Callable:
    """``generate`` run under ``lock`` (the rounds and the top-logprobs passes take turns)."""

    def run(*args: Any, **kwargs: Any):
        with lock:
            return generate(*args, **kwargs)

    return run
