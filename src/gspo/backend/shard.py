"""Data-parallel pieces of the update: a rank's share of a minibatch, the all-reduced loss,
and the ranks' metrics merged into one process's."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .accumulator import Accumulator


def rank_parts(
    mb: torch.Tensor, shard: tuple[int, int], micro: int, pad: torch.Tensor | None = None
) -> list[tuple[torch.Tensor, bool | None]]:
    """A rank's micro-batches of the rows ``mb`` (its own: ``mb[rank::world]``), padded with
    zero-weight passes (``None``: over ``pad``, default the first row) to the count of the
    largest share, so that every rank runs as many forwards and backwards (at least one, also
    when ``mb`` is empty: then over ``pad``, a row of the minibatch)."""
    rank, world = shard
    own = mb[rank::world]
    widest = -(-len(mb) // world)  # rows of the largest share
    count = max(-(-widest // micro), 1)
    parts: list[tuple[torch.Tensor, bool | None]] = [(p, True) for p in own.split(micro) if len(p)]
    parts += [(mb[:1] if pad is None else pad, None)] * (count - len(parts))
    return parts


def all_ranks_sum(value: float) -> float:

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces GPU tensors
    total = torch.tensor([value], dtype=torch.float64, device=device)  # [1]
    dist.all_reduce(total)  # SUM (a NaN or inf on any rank reaches all)
    return float(total)


def merge_rank_metrics(states: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """One process's metrics from the ranks' raw accumulators (``vars(Accumulator)``): weighted
    sums and their weights added up, extremes min/max over ranks. Scalars (loss, grad_norm,
    skipped updates) are global by construction, the same on every rank: rank 0's."""
    acc = Accumulator()
    for state in states:
        for key, value in state["sums"].items():
            acc.sums[key] = acc.sums.get(key, 0.0) + value
            acc.weights[key] = acc.weights.get(key, 0.0) + state["weights"][key]
        for key, value in state["extremes"].items():
            pick = min if key.removesuffix("_off_policy").endswith("/min") else max
            acc.extremes[key] = pick(acc.extremes.get(key, value), value)
    # Scalars sit in every rank's sums with weight 1 per minibatch: the mean of equal values.
    scalars = {k for k, w in states[0]["weights"].items() if k in _GLOBAL_SCALARS}
    for key in scalars:
        acc.sums[key], acc.weights[key] = states[0]["sums"][key], states[0]["weights"][key]
    acc.totals.update(states[0]["totals"])
    return acc.result()


_GLOBAL_SCALARS = ("loss", "grad_norm", "advantage/zero_fraction")
