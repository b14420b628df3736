"""The training forward under ``torch.compile`` (the ``compile`` option), with its shapes
bucketed so that a run compiles a handful of graphs, not one per micro-batch shape.

A micro-batch's shapes vary from step to step: its rows (the live rows of a minibatch), its
distinct prompts, its prompt width and its completion width. Each is padded up to a bucket
before the compiled call, and the result cut back:

- rows to the next power of two, at most the largest micro-batch (``Buckets.rows``) and at
  least a quarter of it; padded rows hold no completion token (mask 0) and reuse the first
  prompt;
- distinct prompts to as many as the batch holds (``Buckets.prompts``), at most the padded rows:
  the extra ones repeat the first prompt and no row reads them;
- prompt columns to the next power of two, by left padding (mask 0: positions are taken from
  the mask, so real tokens keep theirs and no real query sees a pad);
- completion columns to the next power of two, at most ``Buckets.length`` (max_new_tokens), by
  right padding (causal: no real token sees a later one, and the pads' log-probs are cut off).

So the padding changes no real value, only float rounding (a kernel may reduce or block
differently at another width): tests/test_compiled_forward.py checks eager bucketed against
eager unbucketed in float64, and the compiled path against eager within float32 tolerance.
``torch.unique`` (a value-dependent shape) runs eagerly before the graph
(:func:`gspo.models.fast_forward.distinct_prompts`).

Graphs are compiled with ``dynamic=False``, one per bucket key, and inductor's FX graph and
AOTAutograd caches (on by default, under ``TORCHINDUCTOR_CACHE_DIR``, else a folder in the
system's temp dir) let a later run of the same shapes skip most of the cold compile. Only
gradient passes are compiled (a no-grad pass would be one more graph per shape) and only where
the lean forward applies (:func:`gspo.models.fast_forward.supports`, text models).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

from . import fast_forward as ff
from .logprobs import completion_scores, model_kind

RECOMPILE_LIMIT = 64
"""Graphs dynamo keeps per compiled function before it falls back to eager: its default (8) is
below what bucketing gives across the shapes of a run and the models of one process (tests)."""


@dataclass
class CompileRecord:
    """What the compiled forward did in this process (read by benchmarks): the bucket keys it
    compiled and the seconds of their first calls (trace, compile or cache load of the forward
    and backward graphs, and one run of each)."""

    keys: set[tuple] = field(default_factory=set)
    first_call_s: float = 0.0


RECORD = CompileRecord()


@dataclass(frozen=True)
class Buckets:
    """The caps of one batch's buckets: its largest micro-batch's rows, its distinct prompts
    and its longest completion (max_new_tokens)."""

    rows: int
    prompts: int
    length: int

    def shape(self, n: int, u: int, p: int, length: int) -> tuple[int, int, int, int]:
        """(rows, prompts, prompt columns, completion columns) a micro-batch is padded to."""
        # At least a quarter of the cap: each graph costs ~1 min cold, a padded row far less.
        rows = max(_bucket(n, self.rows), -(-self.rows // 4))
        prompts = min(rows, max(self.prompts, u))
        return rows, prompts, _bucket(p, None), _bucket(length, self.length)


def applies(model: torch.nn.Module, pixels) -> bool:
    """Whether the compiled forward computes this model's forward: the lean forward's models,
    without image inputs or blocked tokens."""
    return pixels is None and ff.supports(model) and not model_kind(model).blocked


def token_logprobs(
    model: torch.nn.Module,
    buckets: Buckets,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    temperature: float,
    eager: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gspo.models.logprobs.token_logprobs` (with entropy) of a micro-batch, computed
    at its bucket's shape by the compiled graph of that shape: (log-probs, entropy) [n, L].
    ``eager``: the same padded computation, not compiled (what the padding alone changes)."""
    n, p = prompt_ids.shape
    length = completion_ids.shape[1]
    first, inv = ff.distinct_prompts(model, prompt_index)  # [U], [n]
    rows, prompts, width, cols = buckets.shape(n, len(first), p, length)
    pad_rows = rows - n
    src = torch.cat(
        [torch.arange(n, device=first.device), first[:1].expand(pad_rows)]
    )  # [rows] a pad row: prompt 0
    tokens = (
        _pad(prompt_ids[src], left=width - p),  # [rows, width]
        _pad(prompt_mask[src], left=width - p),
        _pad(completion_ids, right=cols - length, rows=pad_rows),  # [rows, cols]
        _pad(completion_mask, right=cols - length, rows=pad_rows),
    )
    first = torch.cat([first, first[:1].expand(prompts - len(first))])  # [prompts]
    inv = torch.cat([inv, inv.new_zeros(pad_rows)])  # [rows]
    key = (rows, prompts, width, cols, next(model.parameters()).dtype, float(temperature))
    run = _scores if eager else _compiled()
    if not eager and key not in RECORD.keys:
        start = time.perf_counter()
        _compile_backward(model, run(model, *tokens, first, inv, temperature)[0])
        RECORD.keys.add(key)
        RECORD.first_call_s += time.perf_counter() - start
    logp, entropy = run(model, *tokens, first, inv, temperature)  # [rows, cols] each
    return logp[:n, :length], entropy[:n, :length]


def _compile_backward(model: torch.nn.Module, logp: torch.Tensor) -> None:
    """A new graph's first forward output ``logp``, differentiated once here so that the
    backward graph compiles (and is timed) with the forward's. ``autograd.grad`` returns the
    gradients without accumulating them; the caller's own pass is a second forward."""
    params = [p for p in model.parameters() if p.requires_grad]
    if logp.requires_grad and params:
        torch.autograd.grad(logp.sum(), params, allow_unused=True)


def _scores(model, prompt_ids, prompt_mask, completion_ids, completion_mask, first, inv, t):
    """What one graph computes: the lean forward's logits, then log-probs and entropy."""
    logits = ff.shared_prompt_logits(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, first, inv
    )  # [N, L, V]
    return completion_scores(logits, completion_ids, completion_mask, t, True, ())


@functools.cache
def _compiled():
    # One compiled function per process: dynamo keeps its graphs (one per bucket key) on it.
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    return torch.compile(_scores, dynamic=False)


def _bucket(x: int, cap: int | None) -> int:
    """The next power of two from ``x``, but at most ``cap`` (when ``x`` fits under it)."""
    up = 1 << max(x - 1, 0).bit_length()
    return min(up, cap) if cap is not None and x <= cap else up


def _pad(x: torch.Tensor, *, left: int = 0, right: int = 0, rows: int = 0) -> torch.Tensor:
    """``x`` [n, w] with ``left``/``right`` zero columns and ``rows`` zero rows below."""
    out = x.new_zeros((x.shape[0] + rows, left + x.shape[1] + right))
    out[: x.shape[0], left : left + x.shape[1]] = x
    return out
