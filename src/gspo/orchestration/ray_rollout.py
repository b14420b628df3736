"""Rollout workers on Ray: M engines (torch, or vLLM with rollout_engine='vllm'), each built in
its own actor, behind one object that implements the rollout-engine protocol.

:class:`RolloutPool` splits a step's prompts into M contiguous shares, has every worker sample
its share with its own generator, and concatenates the results in prompt order (rows stay
group after group). Worker 0 samples with the step generator itself, so one worker gives
exactly what the engine in the driver gives; worker k > 0 gets a generator seeded from the step
generator's state and k, so a run is reproducible for a fixed M. ``update_weights`` sends the
new full weights to every worker through the object store (one copy).

Image prompts: the step's pixel inputs go into the object store once
(:class:`gspo.backend.ray_refs.PixelRefs`, shared with the training ranks) and every worker's
payload carries their ``ObjectRef`` and its share's range; a worker returns its rollout without
the pixels (the driver holds them) and the pool puts the step's own on the joined rollout.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from typing import Any

import torch

from gspo.config.train import TrainConfig

from ..backend.ray_backend import gather
from ..backend.ray_refs import PixelRefs, resolve
from ..models.logprobs import token_logprobs
from ..models.policy import build_policy, set_threads
from ..rollout.base import PIXELS, GenerationRequest, Rollout, SamplingParams
from ..rollout.engines import close_engine, policy_engine


class RolloutWorker:
    """One rollout engine (run as a Ray actor) with its own copy of the policy."""

    def __init__(self, cfg: TrainConfig, state: dict[str, torch.Tensor]) -> None:
        set_threads(cfg.run.threads)
        self.cfg = cfg
        model, tokenizer = build_policy(cfg.model, torch.device("cpu"), seed=cfg.run.seed)
        model.load_state_dict(state)
        model.requires_grad_(False)
        model.eval()
        self.model = model
        self.engine = policy_engine(cfg, model, tokenizer)

    def pid(self) -> int:
        return os.getpid()

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        gen_state: Any,
        pixels: Any = None,
        share: tuple[int, int] | None = None,
    ) -> Rollout:
        """``pixels``: the step's pixel inputs (an ``ObjectRef``), of which this worker's
        prompts are entries ``share`` = (start, stop)."""
        generator = None
        if gen_state is not None:
            generator = torch.Generator(device=self.engine.device)
            generator.set_state(gen_state)
        if pixels is None:
            return self.engine.generate(GenerationRequest(prompts, n, params, generator))
        start, stop = share
        step = resolve(pixels)
        mine = type(step)(step.values[start:stop], step.mask[start:stop])  # [k, I, ...]
        rollout = self.engine.generate(GenerationRequest(prompts, n, params, generator, mine))
        # The driver holds the pixels: they do not travel back.
        return replace(rollout, extras={k: v for k, v in rollout.extras.items() if k != PIXELS})

    @torch.no_grad()
    def update_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
        self.engine.update_weights(self.model)

    def sleep(self) -> None:
        self.engine.sleep()  # only vLLM engines are asked to (ray_parts.attach_sleeper)

    def wake(self) -> None:
        self.engine.wake()

    def logprobs(self, rollout: Rollout) -> torch.Tensor:
        """[N, L] this worker's policy log-probs of a rollout's completions (for checks)."""
        with torch.no_grad():
            out, _ = token_logprobs(
                self.model,
                rollout.prompt_ids,
                rollout.prompt_mask,
                rollout.completion_ids,
                rollout.completion_mask,
                temperature=self.cfg.rollout.temperature,
            )
        return out

    def close(self) -> None:
        close_engine(self.engine)


def worker_generator_state(generator: torch.Generator, k: int) -> torch.Tensor:
    """Worker k's generator state: the step generator's own for k = 0, else a fresh generator
    seeded from a hash of that state and k (independent streams, the same for every rerun)."""
    state = generator.get_state()
    if k == 0:
        return state
    digest = hashlib.sha256(state.numpy().tobytes() + k.to_bytes(4, "little")).digest()
    derived = torch.Generator(device=generator.device)
    derived.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return derived.get_state()


def shares(count: int, workers: int) -> list[range]:
    """Contiguous shares of ``count`` prompts over ``workers`` (sizes differ by at most 1;
    empty shares dropped)."""
    base, extra = divmod(count, workers)
    out, start = [], 0
    for k in range(workers):
        size = base + (1 if k < extra else 0)
        if size:
            out.append(range(start, start + size))
        start += size
    return out


def concat_in_order(parts: list[Rollout], offsets: list[int], pad_id: int) -> Rollout:
    """One rollout from the workers' parts, in prompt order: prompts left-padded and
    completions right-padded to the widest, prompt indices shifted by each share's start."""
    if len(parts) == 1 and offsets[0] == 0:
        return parts[0]
    p_width = max(r.prompt_ids.shape[1] for r in parts)
    c_width = max(r.completion_ids.shape[1] for r in parts)

    def pad(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
        extra = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
        return torch.cat([extra, t] if left else [t, extra], dim=1)

    return Rollout(
        prompt_ids=torch.cat([pad(r.prompt_ids, p_width, pad_id, True) for r in parts]),
        prompt_mask=torch.cat([pad(r.prompt_mask, p_width, 0, True) for r in parts]),
        completion_ids=torch.cat([pad(r.completion_ids, c_width, pad_id, False) for r in parts]),
        completion_mask=torch.cat([pad(r.completion_mask, c_width, 0, False) for r in parts]),
        logprobs=torch.cat([pad(r.logprobs, c_width, 0.0, False) for r in parts]),  # [N, L]
        finish_reasons=[f for r in parts for f in r.finish_reasons],
        prompt_index=torch.cat(
            [r.prompt_index + o for r, o in zip(parts, offsets, strict=True)]
        ),  # [N]
    )


class RolloutPool:
    """:class:`~gspo.rollout.base.RolloutEngine` over ``workers`` Ray actors."""

    device = torch.device("cpu")  # where the returned tensors live
    model = None  # no driver-side module: the workers hold the weights

    def __init__(
        self,
        ray: Any,
        cfg: TrainConfig,
        model: torch.nn.Module,
        pad_id: int,
        workers: int,
        actor_options: list[dict[str, Any]] | None = None,
        output_dir: str | None = None,
        refs: PixelRefs | None = None,
    ) -> None:
        """``refs``: the object-store copies of pixel inputs, shared with the training ranks
        (one copy per step for both)."""
        self.ray, self.pad_id, self.output_dir = ray, int(pad_id), output_dir
        self.refs = PixelRefs(ray) if refs is None else refs
        state = ray.put({k: v.detach().cpu() for k, v in model.state_dict().items()})
        actor = ray.remote(num_cpus=1)(RolloutWorker)
        options = actor_options or [{} for _ in range(workers)]
        self.workers = [actor.options(**options[k]).remote(cfg, state) for k in range(workers)]
        self.names = [f"rollout worker {k}" for k in range(workers)]
        self.pids = self._all(lambda w: w.pid.remote(), "start-up")
        self.names = [f"rollout worker {k} (pid {p})" for k, p in enumerate(self.pids)]

    def _all(self, call, what: str, workers: list | None = None) -> list:
        chosen = self.workers if workers is None else workers
        names = [self.names[self.workers.index(w)] for w in chosen]
        return gather(self.ray, [call(w) for w in chosen], names, what, self.output_dir)

    def generate(self, request: GenerationRequest) -> Rollout:
        """Image prompts' pixel inputs (one entry per prompt) are sent by reference."""
        split = shares(len(request.prompts), len(self.workers))
        busy = self.workers[: len(split)]
        requests = self.requests(request)
        parts = self._all(lambda w: w.generate.remote(*requests[busy.index(w)]), "generation", busy)
        rollout = concat_in_order(parts, [s.start for s in split], self.pad_id)
        if request.pixels is None:
            return rollout
        return replace(rollout, extras={**rollout.extras, PIXELS: request.pixels})

    def requests(self, request: GenerationRequest) -> list[tuple]:
        """Each busy worker's ``generate`` arguments: its share of the prompts, its generator
        state and, for image prompts, the ``ObjectRef`` of the step's pixel inputs (put once,
        never a tensor per worker) with its share's range."""
        split = shares(len(request.prompts), len(self.workers))
        ref = None if request.pixels is None else self.refs.ref(request.pixels)
        generator, out = request.generator, []
        for k, share in enumerate(split):
            state = None if generator is None else worker_generator_state(generator, k)
            args: tuple = ([request.prompts[i] for i in share], request.n, request.params, state)
            if ref is not None:
                args += (ref, (share.start, share.stop))
            out.append(args)
        return out

    def update_weights(self, model: torch.nn.Module | dict[str, torch.Tensor]) -> None:
        """The new full weights (a module or its state dict) to every worker."""
        state = model if isinstance(model, dict) else model.state_dict()
        ref = self.ray.put({k: v.detach().cpu() for k, v in state.items()})
        self._all(lambda w: w.update_weights.remote(ref), "the weight sync")

    def sleep(self) -> None:
        """Every worker's engine releases its GPU memory (colocated vLLM on CUDA)."""
        self._all(lambda w: w.sleep.remote(), "sleep")

    def wake(self) -> None:
        self._all(lambda w: w.wake.remote(), "wake-up")

    def logprobs(self, rollout: Rollout, worker: int = 0) -> torch.Tensor:
        return self._all(
            lambda w: w.logprobs.remote(rollout), "a log-prob pass", [self.workers[worker]]
        )[0]

    def close(self) -> None:
        """Close the engines (bounded wait) and kill the worker actors; safe to call twice."""
        workers, self.workers = self.workers, []
        try:
            if workers:
                closing = [w.close.remote() for w in workers]
                self.ray.wait(closing, num_returns=len(closing), timeout=10)
        finally:
            for w in workers:
                self.ray.kill(w)
