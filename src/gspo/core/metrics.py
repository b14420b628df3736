"""Scoring statistics shared by evaluation and multi-turn episodes: pass@k, mean and its SE."""

from __future__ import annotations

import math
from collections.abc import Sequence

CORRECT = 1.0 - 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c,k)/C(n,k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(n)); se is 0 for fewer than 2 values."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)
