"""The update's forwards under ``torch.compile`` (the ``compile`` option): one graph per grad
mode, whatever a micro-batch's rows, distinct prompts, prompt width and completion width; and the
policy loss with its metrics (:func:`loss_core`), one graph per loss and grad mode.

A micro-batch's shapes vary from step to step: its rows (the rows of a minibatch that carry a
gradient), its distinct prompts, its prompt width and its completion width. All four are dynamic
dimensions of the graph (``maybe_mark_dynamic``), so any micro-batch runs the same graph at its
own size, computing no padding:

- Rows and prompts: padding them to a bucket (the first version: powers of two) made the
  gradient pass compute every padded row, and the pass took the idle rows (zero advantage) too,
  to fill its bucket: on d128-rev (56% idle rows) the compiled backward did 2.3x the rows of
  eager's and took twice its time.
- Columns: padding prompts and completions to powers of two (the second version) made
  d128-rev's 11-token completions 16 wide, so the compiled pass computed 45% more completion
  tokens than eager's (which cuts each micro-batch to its own widths). The attention layout's
  choice (masked, blocked, causal) depends on the completion width: dynamo guards on its range,
  and a micro-batch past a threshold gets the graph of that layout.

Each dimension is padded only up to :data:`MIN_DYNAMIC` (dynamo specializes sizes 0 and 1): a
pad row holds no completion token (mask 0) and reuses the first prompt; a pad prompt repeats the
first one and no row reads it; a pad prompt column is left padding (mask 0: positions come from
the mask, so real tokens keep theirs and no real query sees a pad); a pad completion column is
right padding (causal: no real token sees it, and its log-prob is cut off). So padding changes
no real value; tests/test_compiled_forward.py checks eager padded against eager unpadded in
float64, and the compiled path against eager within float32 tolerance. ``torch.unique`` (a
value-dependent shape) runs eagerly before the graph
(:func:`gspo.models.fast_forward.distinct_prompts`).

Graphs are compiled with ``dynamic=False`` but for those dimensions, and inductor's FX graph and
AOTAutograd caches (on by default, under ``TORCHINDUCTOR_CACHE_DIR``, else a folder in the
system's temp dir) let a later run of the same graphs skip most of the cold compile. The no-grad
pass (the metrics of zero-advantage rows, see :func:`gspo.backend.update.micro_batches`) is a
graph of its own (dynamo guards on grad mode), forward only. Only where the lean forward applies
(:func:`gspo.models.fast_forward.supports`, text models).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

from gspo.core import losses

from . import fast_forward as ff
from .logprobs import completion_scores, model_kind

RECOMPILE_LIMIT = 64
"""Graphs dynamo keeps per compiled function before it falls back to eager: its default (8) is
below what the models, dtypes and grad modes of one process (tests) can need."""


@dataclass
class CompileRecord:
    """What the compiled forward and decode step did in this process (read by benchmarks): the
    keys of the graphs they compiled (grad mode and dtype; the decode step's cache width) and
    the seconds of their first calls (trace, compile or cache load of the forward and backward
    graphs, and one run of each)."""

    keys: set[tuple] = field(default_factory=set)
    first_call_s: float = 0.0

    def first_call(self, key: tuple, start: float) -> None:
        """Count graph ``key``'s first call, begun at ``time.perf_counter()`` = ``start``."""
        self.keys.add(key)
        self.first_call_s += time.perf_counter() - start


RECORD = CompileRecord()


def compile_graphs(fn):
    """``torch.compile(fn, dynamic=False)`` with dynamo's recompile limit raised to
    :data:`RECOMPILE_LIMIT` (the compiled update and decode step both keep several graphs)."""
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=False)


MIN_DYNAMIC = 2
"""Dynamic dimensions are padded up to this: dynamo specializes a size of 0 or 1, so a
micro-batch of one row (or a one-token completion) would compile a graph of its own."""


def padded_shape(n: int, u: int, p: int, length: int) -> tuple[int, int, int, int]:
    """(rows, prompts, prompt columns, completion columns) a micro-batch of ``n`` rows, ``u``
    distinct prompts, prompts ``p`` and completions ``length`` wide runs at."""
    return (max(n, MIN_DYNAMIC), max(u, MIN_DYNAMIC), max(p, MIN_DYNAMIC), max(length, MIN_DYNAMIC))


def applies(model: torch.nn.Module, pixels) -> bool:
    """Whether the compiled forward computes this model's forward: the lean forward's models,
    without image inputs or blocked tokens."""
    return pixels is None and ff.supports(model) and not model_kind(model).blocked


def token_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    prompt_index: torch.Tensor,
    *,
    temperature: float,
    eager: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gspo.models.logprobs.token_logprobs` (with entropy) of a micro-batch, computed by
    the compiled graph of its grad mode: (log-probs, entropy) [n, L]. ``eager``: the same padded
    computation, not compiled (what the padding alone changes)."""
    n, p = prompt_ids.shape
    length = completion_ids.shape[1]
    first, inv = ff.distinct_prompts(model, prompt_index)  # [U], [n]
    rows, prompts, width, cols = padded_shape(n, len(first), p, length)
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
    if not eager:
        # Fresh tensors (cat, _pad): marking them marks no caller's tensor. "maybe": the graph
        # may carry range guards (e.g. 15 * rows <= 4096 on d128-rev's shapes, or a completion
        # width under an attention layout's threshold); past one, dynamo compiles another graph
        # rather than fail.
        for x in (*tokens, inv):  # [rows, ...]: any count of rows runs the same graph
            torch._dynamo.maybe_mark_dynamic(x, 0)
        for x in tokens:  # [rows, columns]: any prompt and completion width too
            torch._dynamo.maybe_mark_dynamic(x, 1)
        torch._dynamo.maybe_mark_dynamic(first, 0)  # [prompts]
    key = ("update", next(model.parameters()).dtype, float(temperature), torch.is_grad_enabled())
    run = _scores if eager else _compiled()
    if not eager and key not in RECORD.keys:
        start = time.perf_counter()
        _compile_backward(model, run(model, *tokens, first, inv, temperature)[0])
        RECORD.first_call(key, start)
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


def loss_core(terms, logprobs, old_logprobs, advantages, mask, weights, ref, denominator, **kw):
    """:func:`gspo.core.losses.loss_core` as one compiled graph per grad mode (the loss's
    options are constants of a run): the ~80 eager ops of a loss and its metrics, and their
    backward, in a few fused kernels. Every dimension of its tensors is dynamic, as in the
    forward; a size of 1 (one row, a [B, 1] advantage) is a dimension of its own."""
    # Contiguous: a micro-batch's columns are a slice of the batch's, and a graph compiled for
    # one stride would guard on it (a full-width micro-batch's stride equals its width).
    tensors = [
        None if x is None else x.contiguous()
        for x in (logprobs, old_logprobs, advantages, mask, weights, ref)
    ]
    for x in tensors:
        for dim in range(0 if x is None else x.dim()):
            torch._dynamo.maybe_mark_dynamic(x, dim)
    run = functools.partial(_compiled_loss(), terms, *tensors, denominator)
    # The idle rows' loss (metrics only) runs with grad on but log-probs without a gradient.
    key = ("loss", terms.__name__, logprobs.dtype, logprobs.requires_grad)
    if key not in RECORD.keys:
        start = time.perf_counter()
        loss = run(**kw)[0]
        if loss.requires_grad:  # the backward graph compiles (and is timed) with the forward's
            torch.autograd.grad(loss, tensors[0])  # the loss's part only; the forward's is kept
        RECORD.first_call(key, start)
    return run(**kw)


@functools.cache
def _compiled_loss():
    return compile_graphs(losses.loss_core)


@functools.cache
def _compiled():
    # One compiled function per process: dynamo keeps its graphs (one per grad mode) on it.
    # Without duck shaping, rows and prompts get symbols of their own even when a first call
    # has as many of each (float64: every row its own prompt): no guard rows == prompts, so no
    # second graph when a later micro-batch shares prompts.
    torch.fx.experimental._config.use_duck_shape = False
    return compile_graphs(_scores)


def _pad(x: torch.Tensor, *, left: int = 0, right: int = 0, rows: int = 0) -> torch.Tensor:
    """``x`` [n, w] with ``left``/``right`` zero columns and ``rows`` zero rows below."""
    out = x.new_zeros((x.shape[0] + rows, left + x.shape[1] + right))
    out[: x.shape[0], left : left + x.shape[1]] = x
    return out
