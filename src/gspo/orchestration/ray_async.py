"""Asynchronous RL on the Ray backend: the Ray rollout workers generate the batches of the next
steps while the FSDP2 ranks train (``--backend ray --rollout-workers M --max-staleness K``).

The same :class:`~.async_source.AsyncSource` as the local backend's (the same
:class:`~.async_rollout.RolloutThread`, admission: step s starts only with weights >= s - K;
the same :class:`~.async_buffer.StalenessBuffer`, complete groups whose oldest token is
>= s - K; the same producers and ``async/*`` metrics) at another place: :class:`RayWorkers`, the
thread in the driver driving the :class:`~.ray_rollout.RolloutPool` (torch or vLLM engines in the
worker actors), with weights through :class:`ObjectStoreSink`.

Weights: after the update of step k the loop gathers the full weights into the driver's copy
(``RayFSDPBackend.push_weights``, into a torch engine in the driver that shares them and serves
the evaluation) and calls ``publish``: the sink puts them in the object store once (``ray.put``)
and hands the reference to the thread. The trainer never waits for the workers: the thread
sends the reference to every worker (each loads it; Ray runs an actor's calls in order, so the
next chunk samples with it) between two chunks.

Partial rollouts (``async_partial``): a generation is made of chunks of at most
``async_chunk_tokens`` new tokens (:mod:`gspo.rollout.chunked`): each later chunk is a new
request whose prompt is prompt + the tokens so far. New weights reach a running generation at
the next chunk boundary (not inside a chunk); its tokens keep the log-probs and versions of the
weights that made each chunk. 'keep' trains on all of them, 'mask' takes the tokens older than
the row's newest version out of the loss, 'restart' throws the generation away and starts the
step again (chunk 0, same generators). The random stream differs from an unchunked run
(chunk c > 0 draws from a generator derived from the step's and c).

Checkpoint and resume: exactly the local backend's story (see :mod:`.async_source`). A
checkpoint after step k holds the trainer's state only (the ranks' shards, scheduler, RNG,
``StepState``); batches the workers had generated or were generating for steps > k are not in
it. A resumed run pushes the checkpoint's weights (version k) to the workers when the thread
starts and regenerates steps k + 1 .. with the same prompts and seeded generators; no sample is
trained twice and none is lost silently (``async/dropped_samples``, ``async/unused_samples``).
The versions of the regenerated batches may differ from the unbroken run's, and two async runs
with one seed agree in prompts and draws, not bit for bit (thread timing).

Multi-turn episodes: the episode producer runs whole episodes in the driver's thread (the
environments step there) and each round of turns on the workers, chunk by chunk
(:func:`chunked_round_generate`): new weights are loaded at a turn boundary or between two chunks
of a turn, every policy token keeps its chunk's log-prob and version, and ``async_partial``
means what it means for the local episodes (:mod:`.async_episodes`), at chunk granularity.

Not supported (refused): dynamic sampling, rollout_workers = 0.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ..rollout.base import GenerationRequest, Rollout
from ..rollout.chunked import ChunkedGeneration, stop_sequences
from .async_episodes import EpisodeProducer, Restart, turn_boundary
from .async_local import driver_engine
from .async_rollout import WeightSync
from .async_source import AsyncSource, GroupProducer
from .steps import Parts


class ObjectStoreSink:
    """Weights by the Ray object store: one copy per update, loaded by every worker."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.ray = pool, pool.ray

    def start(self, model: torch.nn.Module) -> None:
        self.load(self.put(model))

    def put(self, model: torch.nn.Module) -> Any:
        return self.ray.put({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})

    def load(self, ref: Any) -> None:
        """Every worker loads the weights in the object store (runs on the thread)."""
        self.pool._all(lambda w: w.update_weights.remote(ref), "the weight sync")


class RayWorkers:
    """Tokens generated on the Ray rollout workers, chunk by chunk (at most ``chunk`` new
    tokens per call); new weights enter between two chunks."""

    def __init__(self, pool: Any, chunk: int, tokenizer: Any) -> None:
        self.pool, self.engine, self.chunk, self.tokenizer = pool, pool, chunk, tokenizer
        self.device = torch.device("cpu")  # the step generators (chunk generators derive)
        self.chunks = 0  # chunk calls made (for tests and benchmarks)

    def generation(self, request: GenerationRequest) -> ChunkedGeneration:
        stops = stop_sequences(self.tokenizer, request.params.stop_strings)
        pad = self.tokenizer.pad_token_id
        return ChunkedGeneration(self.pool, request, self.chunk, pad, stops)

    def one_turn(
        self, request: Callable[[], GenerationRequest], weights: WeightSync, mode: str
    ) -> Rollout:
        first = request()
        if first.pixels is not None:  # (refused before the run: config.combinations)
            raise ValueError("image prompts do not travel to Ray rollout workers yet")
        g = self.generation(first)
        while not g.done:
            self.generate_chunk(g, weights.version)
            if weights.newer() and not g.done:  # new weights between two chunks
                weights.sync()
                if mode == "restart":
                    g = self.generation(request())
        return g.result()

    def generate_chunk(self, g: ChunkedGeneration, version: int) -> None:
        """One chunk on the workers (a method, so tests can slow the workers down)."""
        g.run_chunk(version)
        self.chunks += 1

    def round_hook(
        self, weights: WeightSync, mode: str, counts: dict[str, float]
    ) -> Callable[[GenerationRequest], Rollout]:
        return chunked_round_generate(self, weights, mode, counts)

    def close(self) -> None:
        self.pool.close()


def chunked_round_generate(
    place: RayWorkers, weights: WeightSync, mode: str, counts: dict[str, float]
) -> Callable[[GenerationRequest], Rollout]:
    """The driver's ``generate`` hook on the workers: one round of turns, chunk by chunk, with
    weight loads at the turn boundary and between chunks, each token tagged with its version;
    counts the loads in ``counts``. Each round advances the step generator by one draw, so the
    rounds of an episode sample from different streams."""
    rounds = [0]

    def generate(request: GenerationRequest) -> Rollout:
        if request.pixels is not None:  # (refused before the run: config.combinations)
            raise ValueError(
                "episodes with images are sampled by the torch engine only (--rollout-engine "
                "torch, backend='local'); the Ray rollout workers take no pixel inputs"
            )
        turn_boundary(weights, mode, rounds, counts)
        g = place.generation(request)
        while not g.done:
            place.generate_chunk(g, weights.version)
            if weights.newer() and not g.done:  # new weights between two chunks of a turn
                if mode == "restart":
                    raise Restart
                weights.sync()
                counts["async/mid_turn_syncs"] += 1
        if request.generator is not None:
            torch.rand(1, generator=request.generator)  # the next round draws from a new state
        return g.result()

    return generate


def build_ray_source(parts: Parts, model: torch.nn.Module) -> AsyncSource:
    """The Ray async source: groups or episodes made on the rollout workers. The loop's engine
    (sync, evaluation) becomes a driver-side torch engine; the pool is the thread's alone. What
    it cannot do is refused here, and the workers, ranks and Ray that ``build_ray_parts``
    started are shut down before the error propagates."""
    try:
        if not hasattr(parts.engine, "workers"):
            raise ValueError("max_staleness >= 1 with backend='ray' needs rollout_workers >= 1")
        cfg, pool = parts.cfg, parts.engine
        parts.engine = driver_engine(cfg, model, parts.tokenizer)
        view = copy.copy(parts)  # the producer reads cfg, prompts, tokenizer, rewards from it
        view.engine = pool
        chunk = cfg.asynchronous.async_chunk_tokens or max(int(parts.params.max_new_tokens), 1)
        place = RayWorkers(pool, chunk, parts.tokenizer)
        multi = parts.episodes.env.multi_turn
        producer = EpisodeProducer(view) if multi else GroupProducer(view)
        return AsyncSource(cfg, producer, place, ObjectStoreSink(pool), model)
    except BaseException:
        parts.engine.close()
        parts.backend.close()
        raise
