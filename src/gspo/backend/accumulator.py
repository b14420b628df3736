"""The pooling of micro-batch metrics into one step's: token-weighted means, ratio extremes,
sums. Used by the update (:mod:`gspo.backend.update`) and by the merge of FSDP2 ranks'
accumulators (:mod:`gspo.backend.shard`)."""

from __future__ import annotations

import math


class Accumulator:
    """Token-weighted means of micro-batch metrics (min/max for ratio extremes), all and off-policy."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.totals: dict[str, float] = {}

    def _put(self, key: str, value: float, weight: float) -> None:
        base = key.removesuffix("_off_policy")  # ratio/min_off_policy is an extreme too
        if base.endswith("/min"):
            self.extremes[key] = min(self.extremes.get(key, math.inf), value)
        elif base.endswith("/max"):
            self.extremes[key] = max(self.extremes.get(key, -math.inf), value)
        else:
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def add(
        self, metrics: dict[str, float], tokens: int, sequences: int, *, off_policy: bool
    ) -> None:
        # Each metric is pooled over what it averages: ratio/mean over its ratios (sequences for
        # the GSPO family, tokens for GRPO), clip/seq_fraction over sequences, the rest tokens.
        weights = {"ratio/mean": metrics.pop("ratio/count", tokens), "clip/seq_fraction": sequences}
        for key, value in metrics.items():
            weight = weights.get(key, tokens)
            self._put(key, value, weight)
            if off_policy and key.startswith(("clip/", "ratio/", "kl/old_new")):
                self._put(f"{key}_off_policy", value, weight)

    def add_scalar(self, key: str, value: float, reduce: str = "mean") -> None:
        if reduce == "sum":
            self.totals[key] = self.totals.get(key, 0.0) + value
        else:
            self._put(key, value, 1.0)

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}
        out.update(self.extremes)
        out.update(self.totals)
        return out
