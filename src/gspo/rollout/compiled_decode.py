"""The torch engine's decode step under ``torch.compile`` (the ``compile`` option): one graph
for every step of every generation whose KV cache has the same width; and its prefill, one graph
for every prompt count and width (:func:`prefill_logits`).

The eager step (:meth:`gspo.rollout.torch_decode.FastDecoder.decode`) attends over the cache's
filled columns only, a width that grows by one token per step: compiled as it is, that would be a
graph per width. Here every step attends over the whole preallocated cache with the columns not
yet written masked out, and writes its own column at an index passed as a tensor, so a step's
shapes never change while decoding goes on:

- the cache's width is bucketed (:func:`cache_width`: prompt + new tokens up to a multiple of
  :data:`WIDTH_STEP`), so steps whose prompts differ in width by a few tokens share a graph;
- rows are a dynamic dimension (``maybe_mark_dynamic``): any batch size of 2 or more runs the
  same graph (dynamo specializes sizes 0 and 1);
- the cache starts as zeros, not ``torch.empty``: a masked column's probability is exactly 0,
  but 0 times a stale NaN in its value would still be NaN.

A masked column adds exp(-inf) = 0 to the softmax and 0 x value to the output, so the step
computes the eager one's function; the logits differ by float rounding only (the kernels
reduce over another width), within 1e-5 of eager in float32
(tests/test_compiled_decode.py). Sampled tokens can therefore differ where two tokens' log-probs
tie to within that rounding, which is why the option is off by default.
"""

from __future__ import annotations

import functools
import time

import torch

from gspo.models import compiled_forward
from gspo.models.fast_forward import LeanStack

WIDTH_STEP = 16
"""Cache widths are rounded up to a multiple of this: a few graphs across the prompt widths of a
run, at most 15 masked columns of extra attention per step."""


def cache_width(length: int) -> int:
    """The compiled step's cache width for a generation of ``length`` prompt + new tokens."""
    return -(-length // WIDTH_STEP) * WIDTH_STEP


def decode_step(
    stack: LeanStack,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_bias: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    col: torch.Tensor,
) -> torch.Tensor:
    """Feed ``tokens`` [N] at RoPE ``positions`` [N], write their keys and values into cache
    column ``col`` (a 0-d tensor) of every layer's ``keys`` / ``values`` [N, KV, S, D], attend
    over columns 0..col (``key_bias`` [N, 1, 1, S]: -inf at a prompt's padding); logits [N, V]."""
    n, width = tokens.shape[0], keys[0].shape[2]
    x = stack.embed_ids(tokens[:, None])  # [N, 1, hidden]
    rope = stack.rope(positions[:, None])  # at positions [N, 1]
    future = torch.arange(width, device=col.device) > col  # [S] columns not yet written
    bias = key_bias.masked_fill(future, float("-inf"))  # [N, 1, 1, S]
    groups = stack.n_heads // stack.n_kv
    at = col.reshape(1)  # [1]
    for i, w in enumerate(stack.layers):
        q, k, v = stack.qkv(w, x, rope)  # q [N, H, 1, D], k and v [N, KV, 1, D]
        keys[i].index_copy_(2, at, k)
        values[i].index_copy_(2, at, v)
        qg = q.reshape(n, stack.n_kv, groups, stack.head_dim)  # [N, KV, G, D]; head = kv*G + g
        # Products and sums, not matmul: inductor fuses each into one loop over the tiny
        # per-row products, where bmm pays a call per batch of 1 x S products.
        scores = (qg[:, :, :, None] * keys[i][:, :, None]).sum(-1)  # [N, KV, G, S]
        scores = scores * stack.scaling + bias  # [N, KV, G, S]
        probs = scores.softmax(dim=-1)  # [N, KV, G, S]
        o = (probs[..., None] * values[i][:, :, None]).sum(-2)  # [N, KV, G, D]
        x = stack.out_and_mlp(w, x, o.reshape(n, 1, -1))
    return stack.logits(x[:, -1])  # [N, V]


def run_step(
    stack: LeanStack,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_bias: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    col: int,
) -> torch.Tensor:
    """:func:`decode_step` through its compiled graph; a new graph's first call is timed into
    ``gspo.models.compiled_forward.RECORD`` (the compile cost benchmarks report)."""
    for x in (*keys, *values, key_bias, tokens, positions):  # [N, ...]: any row count
        torch._dynamo.maybe_mark_dynamic(x, 0)
    key = ("decode", keys[0].shape[2], stack.dtype)
    start = time.perf_counter()
    logits = _compiled()(stack, keys, values, key_bias, tokens, positions, torch.tensor(col))
    if key not in compiled_forward.RECORD.keys:
        compiled_forward.RECORD.first_call(key, start)
    return logits


def prefill_logits(
    stack: LeanStack, ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """:meth:`LeanStack.prompt_pass` of the distinct prompts ``ids`` [U, P] and their last
    position's logits [U, V], through one compiled graph: prompts, prompt width and the RoPE
    tables' length are dynamic dimensions, so every step's prefill runs it."""
    for x in (ids, valid, positions):  # [U, P]
        torch._dynamo.maybe_mark_dynamic(x, 0)
        torch._dynamo.maybe_mark_dynamic(x, 1)
    for x in (stack.cos, stack.sin):  # [T, D] RoPE tables: T is the decoder's cache width
        torch._dynamo.maybe_mark_dynamic(x, 0)
    key = ("prefill", stack.dtype)
    start = time.perf_counter()
    logits, kv = _compiled_prefill()(stack, ids, valid, positions)
    if key not in compiled_forward.RECORD.keys:
        compiled_forward.RECORD.first_call(key, start)
    return logits, kv


def _prefill(stack: LeanStack, ids, valid, positions):
    last, kv = stack.prompt_pass(ids, valid, positions)  # [U, hidden], [U, KV, P, D] per layer
    return stack.logits(last), kv  # [U, V]


@functools.cache
def _compiled():
    # One compiled function per process: dynamo keeps its graphs (one per cache width) on it.
    return compiled_forward.compile_graphs(decode_step)


@functools.cache
def _compiled_prefill():
    return compiled_forward.compile_graphs(_prefill)
