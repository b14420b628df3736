"""Asynchronous RL on the Ray backend: the Ray rollout workers generate the batches of the next
steps while the FSDP2 ranks train (``--backend ray --rollout-workers M --max-staleness K``).

:class:`RayAsyncSource` is :class:`~.async_source.AsyncSource` with another producer: the same
:class:`~.async_rollout.RolloutThread` (admission: step s starts only with weights >= s - K),
the same :class:`~.async_buffer.StalenessBuffer` (complete groups whose oldest token is >= s - K)
and the same ``async/*`` metrics, but the thread runs in the driver and drives the
:class:`~.ray_rollout.RolloutPool` (torch or vLLM engines in the worker actors) instead of a
local engine.

Weights: after the update of step k the loop gathers the full weights into the driver's copy
(``RayFSDPBackend.push_weights``, into a torch engine in the driver that shares them and serves
the evaluation) and calls ``publish``, which puts them in the object store once (``ray.put``)
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

Multi-turn episodes: :class:`RayEpisodeSource` runs whole episodes in the driver's thread (the
environments step there) and each round of turns on the workers, chunk by chunk
(:func:`chunked_round_generate`): new weights are loaded at a turn boundary or between two chunks
of a turn, every policy token keeps its chunk's log-prob and version, and ``async_partial``
means what it means for the local episodes (:mod:`.async_episodes`), at chunk granularity.

Not supported (refused): dynamic sampling, rollout_workers = 0.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from gspo.config.combinations import Options

from ..core.seeding import prompt_indices, step_generator
from ..rollout.base import Rollout, SamplingParams
from ..rollout.chunked import ChunkedGeneration
from ..rollout.partial import sample_versions
from .async_episodes import EpisodeProducer, Restart, turn_boundary
from .async_rollout import Produced, RolloutThread, WeightSync
from .async_source import AsyncSource, mask_older_tokens
from .state import Parts
from .steps import _to_device, score_round


def driver_engine(cfg: Options, model: torch.nn.Module, tokenizer: Any) -> Any:
    """A torch engine in the driver on the driver's copy of the weights (which
    ``push_weights`` refreshes every step): the evaluation's engine in async Ray runs, so an
    evaluation never waits for the workers nor sees their (older) weights."""
    from ..models.build import DTYPES
    from ..rollout.build import train_engine

    return train_engine(
        replace(cfg, engine=replace(cfg.engine, rollout_engine="torch")),
        model,
        tokenizer,
        dtype=DTYPES[cfg.engine.engine_dtype] if cfg.engine.engine_dtype else None,
        share_weights=cfg.engine.engine_dtype is None,
    )


class RayAsyncSource(AsyncSource):
    """Scored batches from the Ray rollout workers, driven by a rollout thread in the driver."""

    def __init__(self, parts: Parts, model: torch.nn.Module) -> None:
        cfg = parts.cfg
        self.cfg, self.mode, self.model = cfg, cfg.asynchronous.async_partial, model
        self.pool = parts.engine
        self.ray = self.pool.ray
        # The loop's engine (sync, evaluation) becomes a driver-side torch engine; the pool is
        # the thread's alone.
        parts.engine = driver_engine(cfg, model, parts.tokenizer)
        self.parts = copy.copy(parts)  # score_round reads cfg, tokenizer, rewards from it
        self.parts.engine = self.pool
        self.chunk = cfg.asynchronous.async_chunk_tokens or max(int(parts.params.max_new_tokens), 1)
        self.thread: RolloutThread | None = None
        self.unused = 0
        self.chunks = 0  # chunk calls made (for tests and benchmarks)

    def _put(self, model: torch.nn.Module) -> Any:
        return self.ray.put({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})

    def start(self, start: int, end: int) -> None:
        """Send the trainer's current weights (after a resume: the checkpoint's) to the workers,
        then start the thread for steps ``start .. end - 1``."""
        self._load(self._put(self.model))
        self.thread = RolloutThread(
            self._produce,
            self._load,
            start=start,
            end=end,
            group_size=self.cfg.rollout.group_size,
            max_staleness=self.cfg.asynchronous.max_staleness,
        )
        self.thread.start()

    def _load(self, ref: Any) -> None:
        """Every worker loads the weights in the object store (runs on the thread)."""
        self.pool._all(lambda w: w.update_weights.remote(ref), "the weight sync")

    def _produce(self, step: int, weights: WeightSync) -> Produced:
        """Generate (chunk by chunk, on the workers) and score the batch of ``step``."""
        cfg, parts = self.cfg, self.parts
        t0 = time.perf_counter()
        idx = prompt_indices(len(parts.train_set), step, cfg.rollout.prompts_per_step, cfg.run.seed)
        prompts = [parts.prompt_cache[i] for i in idx]

        def fresh() -> ChunkedGeneration:
            gen = step_generator(cfg.run.seed, step, stream=0, device=torch.device("cpu"))
            pad = parts.tokenizer.pad_token_id
            return ChunkedGeneration(
                self.pool, prompts, cfg.rollout.group_size, parts.params, gen, self.chunk, pad,
                stop_sequences(parts.tokenizer, parts.params.stop_strings),
            )  # fmt: skip

        g = fresh()
        while not g.done:
            self.generate_chunk(g, weights.version)
            if weights.newer() and not g.done:  # new weights between two chunks
                weights.sync()
                if self.mode == "restart":
                    g = fresh()
        rollout = g.result()
        if self.mode == "mask":
            rollout = mask_older_tokens(rollout)
        oldest, newest = sample_versions(rollout)  # [N], [N]
        sampled = score_round(
            parts, _to_device(rollout, parts.device), [parts.train_set[i] for i in idx]
        )
        size = cfg.rollout.group_size
        lo, hi = oldest.view(-1, size).tolist(), newest.view(-1, size).tolist()
        return Produced(lo, hi, sampled, time.perf_counter() - t0)

    def generate_chunk(self, g: ChunkedGeneration, version: int) -> None:
        """One chunk on the workers (a method, so tests can slow the workers down)."""
        g.run_chunk(version)
        self.chunks += 1

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """After the update of step ``version - 1``: one object-store copy of the gathered
        weights for the thread; returns at once (the workers load it between chunks)."""
        assert self.thread is not None
        self.thread.publish(self._put(model), version)

    def close(self) -> int:
        """Stop the thread (it finishes its step), close the workers; the unused samples."""
        try:
            return super().close()
        finally:
            self.pool.close()


def stop_sequences(tokenizer: Any, stop_strings: tuple[str, ...]) -> list[list[int]]:
    """The stop strings' token ids (as the engines encode them), for the chunk boundaries."""
    return [list(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in stop_strings]


def chunked_round_generate(
    source: RayAsyncSource, weights: WeightSync, mode: str, counts: dict[str, float]
) -> Callable[..., Rollout]:
    """The driver's ``generate`` hook on the workers: one round of turns, chunk by chunk, with
    weight loads at the turn boundary and between chunks, each token tagged with its version;
    counts the loads in ``counts``. Each round advances the step generator by one draw, so the
    rounds of an episode sample from different streams."""
    rounds = [0]
    pad = source.parts.tokenizer.pad_token_id

    def generate(
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        turn_boundary(weights, mode, rounds, counts)
        stops = stop_sequences(source.parts.tokenizer, params.stop_strings)
        g = ChunkedGeneration(source.pool, prompts, n, params, generator, source.chunk, pad, stops)
        while not g.done:
            source.generate_chunk(g, weights.version)
            if weights.newer() and not g.done:  # new weights between two chunks of a turn
                if mode == "restart":
                    raise Restart
                weights.sync()
                counts["async/mid_turn_syncs"] += 1
        if generator is not None:
            torch.rand(1, generator=generator)  # the next round draws from a new state
        return g.result()

    return generate


class RayEpisodeSource(EpisodeProducer, RayAsyncSource):
    """Scored batches of multi-turn episodes: the environments step in the driver's rollout
    thread, the turns are generated on the Ray rollout workers."""

    def round_hook(self, weights: WeightSync, counts: dict[str, float]) -> Callable[..., Rollout]:
        return chunked_round_generate(self, weights, self.mode, counts)

    def episode_engine(self) -> tuple[Any, torch.device]:
        return self.pool, torch.device("cpu")


def build_ray_source(parts: Parts, model: torch.nn.Module) -> RayAsyncSource:
    """The Ray async source; what it cannot do is refused here, and the workers, ranks and Ray
    that ``build_ray_parts`` started are shut down before the error propagates."""
    try:
        if not hasattr(parts.engine, "workers"):
            raise ValueError("max_staleness >= 1 with backend='ray' needs rollout_workers >= 1")
        if parts.episodes.env.multi_turn:
            return RayEpisodeSource(parts, model)
        return RayAsyncSource(parts, model)
    except BaseException:
        parts.engine.close()
        parts.backend.close()
        raise
