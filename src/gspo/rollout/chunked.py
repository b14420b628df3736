"""Chunked generation: partial rollouts over any token-in/token-out engine (torch, vLLM, a
pool of Ray workers), paused only at chunk boundaries.

A generation of up to ``max_new_tokens`` is made of calls of at most ``chunk`` new tokens each.
The first call samples ``n`` completions per prompt; every later call continues each unfinished
row from its prompt + the tokens generated so far, as a new request (``n`` = 1) with fewer new
tokens left: the abort-and-resubmit of slime, and how verl and OpenRLHF continue partial
rollouts. Between two calls the engine may take new weights; each chunk's tokens keep the
log-probs of the weights that made them and their policy version (``Rollout.versions``).

What differs from :class:`~gspo.rollout.partial.ResumableGeneration` (the local thread's
torch-only pause at any token):

- the pause has chunk granularity: new weights reach a running generation at the next chunk
  boundary (at most ``chunk`` tokens later), never inside a chunk;
- the random stream differs from an unchunked run: chunk c > 0 draws from a generator derived
  from the step generator's state and c (reproducible for a fixed chunk size and worker
  count), and every chunk re-prefills prompt + prefix (no KV cache carried over);
- a stop string is matched by the engine inside a chunk; one spanning a chunk boundary is
  matched here on the row's tokens (``stop_seqs``: the stop strings' token ids), and the row
  ends at it as the engine would have stopped there (the tokens the chunk drew past it are
  dropped).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .base import NO_VERSION, GenerationRequest, Rollout


def chunk_generator(generator: torch.Generator | None, chunk: int) -> torch.Generator | None:
    """The generator of chunk ``chunk``: the step generator for chunk 0, else a generator
    seeded from a hash of its (initial) state and the chunk index."""
    if generator is None or chunk == 0:
        return generator
    state = generator.get_state()
    digest = hashlib.sha256(state.numpy().tobytes() + b"chunk" + chunk.to_bytes(4, "little"))
    out = torch.Generator(device=generator.device)
    out.manual_seed(int.from_bytes(digest.digest()[:8], "little") & ((1 << 63) - 1))
    return out


class ChunkedGeneration:
    """One batched generation (rows ``i * n + j``) made chunk by chunk through ``engine``."""

    def __init__(
        self,
        engine: Any,
        request: GenerationRequest,
        chunk: int,
        pad_id: int,
        stop_seqs: list[list[int]] | tuple = (),
    ) -> None:
        if chunk < 1:
            raise ValueError(f"async_chunk_tokens must be >= 1, got {chunk}")
        if request.pixels is not None:  # a chunk's continuation is a new request, no images
            raise ValueError(
                "partial rollouts of image prompts need the torch engine (--rollout-engine torch)"
            )
        self.engine, self.prompts, self.n = engine, request.prompts, request.n
        self.params, self.chunk, self.pad_id = request.params, chunk, int(pad_id)
        self.stop_seqs = [list(q) for q in stop_seqs if q]
        generator = request.generator
        # The initial state, so chunk c's generator does not depend on how far chunk 0 drew.
        self._gen_state = None if generator is None else generator.get_state()
        self._gen_device = None if generator is None else generator.device
        self.max_new = max(int(self.params.max_new_tokens), 0)
        rows = len(self.prompts) * self.n
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.logprobs: list[list[float]] = [[] for _ in range(rows)]
        self.versions: list[list[int]] = [[] for _ in range(rows)]
        # Nothing to generate (max_new_tokens 0): done at once, as the engines' "length".
        self.finish: list[str | None] = [None if self.max_new else "length"] * rows
        self.calls = 0  # chunks generated so far
        # Tokens every unfinished row has: a row stays unfinished only after a chunk ended on
        # its length limit, so all of them advance by whole chunks.
        self.generated = 0
        self.logp_dtype = torch.float32

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finish)

    def _generator(self) -> torch.Generator | None:
        if self._gen_state is None:
            return None
        g = torch.Generator(device=self._gen_device)
        g.set_state(self._gen_state)
        return chunk_generator(g, self.calls)

    def run_chunk(self, version: int) -> None:
        """Generate the next chunk with the engine's current weights, tagged ``version``."""
        if self.done:
            return
        size = min(self.chunk, self.max_new - self.generated)
        params = replace(self.params, max_new_tokens=size)
        if self.calls == 0:
            rows = list(range(len(self.tokens)))
            out = self.engine.generate(
                GenerationRequest(self.prompts, self.n, params, self._generator())
            )
        else:
            rows = [i for i, f in enumerate(self.finish) if f is None]
            cont = [self.prompts[i // self.n] + self.tokens[i] for i in rows]
            out = self.engine.generate(GenerationRequest(cont, 1, params, self._generator()))
        self.logp_dtype = out.logprobs.dtype
        lengths = out.completion_mask.sum(dim=1).tolist()  # [rows]
        self.generated += size
        for k, i in enumerate(rows):
            got, before = int(lengths[k]), len(self.tokens[i])
            self.tokens[i] += out.completion_ids[k, :got].tolist()
            self.logprobs[i] += out.logprobs[k, :got].tolist()
            self.versions[i] += [version] * got
            end = self._stop_across(self.tokens[i], before) if self.calls else None
            if end is not None:  # a stop string across the chunk boundary: the row ends there
                del self.tokens[i][end:], self.logprobs[i][end:], self.versions[i][end:]
                self.finish[i] = "stop"
            elif out.finish_reasons[k] == "stop":
                self.finish[i] = "stop"
            elif self.generated >= self.max_new:
                self.finish[i] = "length"
        self.calls += 1

    def run(
        self, max_tokens: int | None, version: int, stop: Callable[[], bool] | None = None
    ) -> int:
        """Chunks until done, ``max_tokens`` (rounded up to whole chunks) or a chunk after
        which ``stop()`` is true (:class:`~gspo.rollout.base.PartialGeneration`); the tokens
        each unfinished row advanced by."""
        before = self.generated
        while not self.done and (max_tokens is None or self.generated - before < max_tokens):
            self.run_chunk(version)
            if stop is not None and stop():
                break
        return self.generated - before

    def pause(self) -> None:
        """Nothing to drop: every chunk is a new request (no cache carried over)."""

    def _stop_across(self, tokens: list[int], boundary: int) -> int | None:
        """The end of the first stop sequence in ``tokens`` that starts before ``boundary``
        (the previous chunks' tokens) and ends after it, or None. The engine saw only the
        new chunk's tokens, so these are the stops it could not match; the earliest wins."""
        best = None
        for seq in self.stop_seqs:
            for start in range(max(boundary - len(seq) + 1, 0), boundary):
                end = start + len(seq)
                if end > len(tokens) or (best is not None and end >= best):
                    break
                if tokens[start:end] == seq:
                    best = end
                    break
        return best

    def result(self) -> Rollout:
        """The generation as a ``Rollout`` with per-token ``versions``; call once ``done``."""
        if not self.done:
            raise RuntimeError(f"chunked generation not finished after {self.calls} chunks")
        rows, width = len(self.tokens), max(len(p) for p in self.prompts)
        length = max((len(t) for t in self.tokens), default=0)
        prompt_ids = torch.full((rows, width), self.pad_id, dtype=torch.long)  # [N, P]
        prompt_mask = torch.zeros((rows, width), dtype=torch.long)  # [N, P]
        ids = torch.full((rows, length), self.pad_id, dtype=torch.long)  # [N, L]
        mask = torch.zeros((rows, length), dtype=torch.long)  # [N, L]
        logps = torch.zeros((rows, length), dtype=self.logp_dtype)  # [N, L]
        versions = torch.full((rows, length), NO_VERSION, dtype=torch.long)  # [N, L]
        for i in range(rows):
            p, size = self.prompts[i // self.n], len(self.tokens[i])
            prompt_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            prompt_mask[i, width - len(p) :] = 1
            ids[i, :size] = torch.tensor(self.tokens[i], dtype=torch.long)
            mask[i, :size] = 1
            logps[i, :size] = torch.tensor(self.logprobs[i], dtype=self.logp_dtype)
            versions[i, :size] = torch.tensor(self.versions[i], dtype=torch.long)
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=ids,
            completion_mask=mask,
            logprobs=logps,
            finish_reasons=[f or "length" for f in self.finish],
            prompt_index=torch.arange(len(self.prompts)).repeat_interleave(self.n),  # [N]
            versions=versions,
        )


def stop_sequences(tokenizer: Any, stop_strings: tuple[str, ...]) -> list[list[int]]:
    """The stop strings' token ids (as the engines encode them), for the chunk boundaries."""
    return [list(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in stop_strings]
