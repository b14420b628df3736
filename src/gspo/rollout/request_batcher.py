"""Rounds of HTTP completion requests batched into ``engine.generate`` calls.

The endpoint (:mod:`gspo.rollout.openai_server`) hands every request to a
:class:`RequestBatcher`, which answers it from the next *round*: the pending requests sorted by
episode (registration order) and arrival within the episode, grouped by sampling parameters
(``n``, ``max_new_tokens``, temperature, top-p, stop strings; one group in training, where the
run's sampling is fixed), one ``generate`` call per group. A request with a ``seed`` is a group
of its own, sampled with a generator seeded by it: its completions then depend only on the
request, not on what else the round holds.

When a round runs (deterministic batching, so a training run is reproducible):
* with episodes registered (training): once every live episode has a request pending or has
  ended. Liveness fallback: if requests are pending and nothing new (a request, an episode's
  end) happened for ``patience_s`` seconds, the round runs with what is pending; an agent that
  waits on something else than the model (a slow tool) then only delays the others by
  ``patience_s``, and the run is no longer bit-reproducible (a warning is counted in
  ``fallback_rounds``).
* with none (``gspo serve``): ``window_s`` after the first pending request, with everything
  pending by then.

The engine runs in a worker thread (``asyncio.to_thread``), so the server keeps accepting
requests during a round.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .base import GenerationRequest, Rollout, SamplingParams


@dataclass
class Sample:
    """One sampled completion of a request."""

    ids: list[int]
    logprobs: list[float]
    finish: str
    """"stop" (an end token or stop string) or "length"."""
    versions: list[int] | None = None
    """Per token: the policy version that sampled it, when the engine records them."""


@dataclass
class _Pending:
    key: tuple[int, int]
    prompt: list[int]
    n: int
    params: SamplingParams
    future: asyncio.Future = field(repr=False)
    seed: int | None = None


class RequestBatcher:
    """Collects requests in the server's event loop and answers them round by round."""

    def __init__(
        self,
        generate: Callable[[GenerationRequest], Rollout],
        *,
        generator: Any = None,
        patience_s: float = 5.0,
        window_s: float = 0.01,
    ) -> None:
        self.generate = generate
        self.generator = generator
        self.patience_s = patience_s
        self.window_s = window_s
        self.fallback_rounds = 0
        """Rounds run by the liveness fallback (not every live episode was waiting)."""
        self.rounds = 0
        self._lock = threading.Lock()
        self._order: dict[str, int] = {}  # episode id -> registration index
        self._live: set[str] = set()
        self._pending: list[_Pending] = []
        self._seq = 0
        self._last_event = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    # Called from any thread (the driver's).
    def register(self, episode: str) -> None:
        with self._lock:
            self._order.setdefault(episode, len(self._order))
            self._live.add(episode)
        self._poke()

    def end(self, episode: str) -> None:
        """The episode makes no more requests (finished, failed or cut)."""
        with self._lock:
            self._live.discard(episode)
        self._poke()

    def _poke(self) -> None:
        self._last_event = time.monotonic()
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # Called in the server's event loop.
    async def submit(
        self,
        episode: str | None,
        prompt: list[int],
        n: int,
        params: SamplingParams,
        seed: int | None = None,
    ) -> list[Sample]:
        """The ``n`` samples of ``prompt`` from the next round (``seed``: drawn with a
        generator of its own, seeded by it)."""
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            rank = self._order.get(episode, len(self._order)) if episode else 1 << 30
            self._pending.append(_Pending((rank, self._seq), prompt, n, params, future, seed))
            self._seq += 1
        self._poke()
        return await future

    async def run(self) -> None:
        """The round loop (a task in the server's event loop)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while True:
            batch = self._take_round()
            if batch is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.window_s)
                self._wake.clear()
                continue
            await self._answer(batch)

    def _take_round(self) -> list[_Pending] | None:
        with self._lock:
            if not self._pending:
                return None
            idle = time.monotonic() - self._last_event
            waiting = {p.key[0] for p in self._pending}
            live = {self._order[e] for e in self._live}
            if self._live:
                if not live <= waiting:
                    if idle < self.patience_s:
                        return None
                    self.fallback_rounds += 1
            elif idle < self.window_s:
                return None
            batch, self._pending = sorted(self._pending, key=lambda p: p.key), []
        return batch

    async def _answer(self, batch: list[_Pending]) -> None:
        groups: dict[tuple, list[_Pending]] = {}
        for p in batch:
            alone = () if p.seed is None else (p.key,)  # a seeded request: a call of its own
            groups.setdefault((p.n, p.params, *alone), []).append(p)
        for (n, params, *_), items in groups.items():
            seed = items[0].seed
            generator = self.generator if seed is None else self._seeded(seed)
            try:
                request = GenerationRequest([p.prompt for p in items], n, params, generator)
                out = await asyncio.to_thread(self.generate, request)
            except Exception as err:  # every request of the group gets the error
                for p in items:
                    if not p.future.done():
                        p.future.set_exception(err)
                continue
            for i, p in enumerate(items):
                if not p.future.done():  # a cancelled request (its episode was cut) is skipped
                    p.future.set_result([_sample(out, i * n + j) for j in range(n)])
        self.rounds += 1

    def _seeded(self, seed: int) -> torch.Generator:
        """A generator seeded by a request's ``seed``, where the round's generator lives."""
        device = "cpu" if self.generator is None else self.generator.device
        return torch.Generator(device=device).manual_seed(seed)


def _sample(out: Rollout, row: int) -> Sample:
    keep = out.completion_mask[row].bool()  # [L]
    versions = None if out.versions is None else out.versions[row][keep].tolist()
    return Sample(
        ids=out.completion_ids[row][keep].tolist(),
        logprobs=out.logprobs[row][keep].tolist(),
        finish=out.finish_reasons[row],
        versions=versions,
    )
