"""Partial rollouts through the public engine protocol: a generation that can stop part way and
continue later, possibly under new weights, on any engine.

Asynchronous RL (``gspo.orchestration.async_rollout``) lets the engine keep sampling while the
trainer trains; when new weights arrive in the middle of a generation it is paused, the engine
loads them, and the generation continues under them. :func:`partial_generation` gives the
engine's own :class:`~gspo.rollout.base.PartialGeneration` when it has one
(:class:`~gspo.rollout.base.ResumableEngine`: the torch engine pauses at any token, see
:mod:`gspo.rollout.torch_decode`), else chunks of its ``generate`` (vLLM, a pool of Ray
workers: :class:`~gspo.rollout.chunked.ChunkedGeneration`, new weights between two chunks).

Every token keeps the log-prob and the policy version of the weights that produced it:
``Rollout.versions`` [N, L] next to ``Rollout.logprobs`` [N, L]. These recorded log-probs are the
behaviour policy of the sample (a product of per-token probabilities from mixed versions), which
is what the losses use as "old" log-probs.
"""

from __future__ import annotations

from typing import Any

import torch

from gspo.rollout.base import (
    NO_VERSION,
    GenerationRequest,
    PartialGeneration,
    ResumableEngine,
    Rollout,
    RolloutEngine,
)
from gspo.rollout.chunked import ChunkedGeneration, stop_sequences


def partial_generation(
    engine: RolloutEngine, request: GenerationRequest, *, chunk: int, tokenizer: Any = None
) -> PartialGeneration:
    """A partial generation on ``engine``: its own (:class:`ResumableEngine`), else chunks of at
    most ``chunk`` new tokens through ``generate`` (``tokenizer`` encodes the stop strings, so
    that one spanning a chunk boundary is matched). Image prompts (``request.pixels``) need the
    torch engine's own partial generation, which takes them, every re-prefill after a pause
    again."""
    if isinstance(engine, ResumableEngine):
        return engine.partial(request)
    params = request.params
    stops = stop_sequences(tokenizer, params.stop_strings) if params.stop_strings else []
    pad = engine.pad_id  # type: ignore[attr-defined]
    return ChunkedGeneration(engine, request, chunk, pad, stops)


def sample_versions(rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """(oldest [N], newest [N]) policy version over each row's generated tokens; a row without
    tokens gets NO_VERSION for both. Needs ``rollout.versions``."""
    if rollout.versions is None:
        raise ValueError("the rollout carries no per-token versions")
    v = rollout.versions  # [N, L]
    has = v != NO_VERSION  # [N, L]
    big = torch.iinfo(torch.long).max
    oldest = v.masked_fill(~has, big).min(dim=1).values if v.shape[1] else v.sum(dim=1)  # [N]
    newest = v.max(dim=1).values if v.shape[1] else v.sum(dim=1)  # [N]
    none = ~has.any(dim=1)  # [N]
    return oldest.masked_fill(none, NO_VERSION), newest.masked_fill(none, NO_VERSION)
