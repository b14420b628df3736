"""How learning is compared (DESIGN.md): one routine for every statement that one condition
learns better than another (an objective, a setting, a commit, gspo against TRL).

Runs are paired by seed (a seed fixes the cold start, the data order and the held-out problems,
so pairing removes the large variation between seeds). For the per-seed differences
d_i = a_i - b_i over n seeds:

- the mean difference and its standard error, SE = sd(d) / sqrt(n);
- a 95% percentile-bootstrap interval of the mean (10,000 resamples of the seeds, a fixed RNG
  seed, so a report is reproducible);
- the minimum detectable effect: the true difference a paired t-test at two-sided
  alpha = 0.05 would detect with probability 0.8 at this n and this spread,
  MDE = (t_{n-1, 0.975} + t_{n-1, 0.80}) * SE;
- the verdict: a difference is called one only when the interval excludes 0 with at least
  ``MIN_SEEDS`` (10) seeds; otherwise "cannot tell at this power", with the MDE beside it.

Speed is compared the same way, paired by round instead of by seed (``ratio_interval``): a
round runs each system once, back to back, so a change of machine load falls on both; the
statement is the geometric mean of the per-round time ratios with a 95% t-interval of the mean
log-ratio. A t-interval, not the bootstrap: speed runs afford few rounds (3-20), where the
percentile bootstrap is too narrow (with 2 rounds it is just the two ratios' range).

Pure functions of floats (no torch), so benchmarks, experiments and the report share them.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_SEEDS = 10
"""Fewest paired seeds at which a difference whose interval excludes 0 is called one."""
RESAMPLES = 10_000
LEVEL = 0.95
POWER = 0.80


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (inverse CDF) at probability ``p`` with ``df`` degrees of freedom.

    Exact for df 1 and 2; Abramowitz & Stegun 26.7.5 (a four-term expansion around the normal
    quantile) above, within 0.004 of the exact value at df 3 and 3e-5 from df 9 on."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def bootstrap_interval(
    values: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (resampled with replacement)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    lo = means[max(0, math.floor(tail * resamples))]
    hi = means[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return lo, hi


def mde(se: float, n: int, *, level: float = LEVEL, power: float = POWER) -> float:
    """Minimum detectable effect of a paired t-test at this standard error and n seeds."""
    if n < 2 or math.isnan(se):
        return math.nan
    return (t_quantile(1 - (1 - level) / 2, n - 1) + t_quantile(power, n - 1)) * se


@dataclass(frozen=True)
class Comparison:
    """A paired comparison of condition ``a`` against ``b`` (differences a - b)."""

    a: str
    b: str
    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float
    se: float
    low: float
    high: float
    mde: float
    problems: int | None = None
    """Held-out problems each run was scored on (None: not a held-out score)."""
    shared_baseline: int = 1
    """How many comparisons reuse ``b``'s runs (1: each baseline run is in this pairing only)."""

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def wins(self) -> tuple[int, int, int]:
        """Seeds where a is above, below, equal to b."""
        d = self.differences
        return sum(x > 0 for x in d), sum(x < 0 for x in d), sum(x == 0 for x in d)

    @property
    def verdict(self) -> str:
        """'a higher', 'a lower' (interval excludes 0 with >= MIN_SEEDS seeds), else
        'cannot tell at this power'."""
        if self.n >= MIN_SEEDS and not math.isnan(self.low):
            if self.low > 0:
                return f"{self.a} higher"
            if self.high < 0:
                return f"{self.a} lower"
        return "cannot tell at this power"

    def line(self, digits: int = 3) -> str:
        """One line for a report: difference, SE, interval, MDE, seeds, problems, verdict."""
        f = f".{digits}f"
        above, below, _ = self.wins
        problems = f" x {self.problems} problems" if self.problems else ""
        shared = (
            f"; {self.b}'s runs shared by {self.shared_baseline} comparisons"
            if self.shared_baseline > 1
            else ""
        )
        if self.n < 2:
            return (
                f"{self.a} - {self.b}: {self.mean:{f}} (n = {self.n} seed{problems}: no interval)"
                f" -> {self.verdict}{shared}"
            )
        why = ""
        if self.verdict.startswith("cannot tell"):
            why = f" (MDE {self.mde:{f}}" + (
                f", fewer than {MIN_SEEDS} seeds)" if self.n < MIN_SEEDS else ")"
            )
        return (
            f"{self.a} - {self.b}: {self.mean:+{f}} ± {self.se:{f}} (95% CI [{self.low:+{f}}, "
            f"{self.high:+{f}}], MDE {self.mde:{f}}; {self.n} seeds{problems}, "
            f"above/below {above}/{below}) -> {self.verdict}{why}{shared}"
        )

    def to_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "seeds": list(self.seeds),
            "differences": list(self.differences),
            "mean": self.mean,
            "se": self.se,
            "ci95": [self.low, self.high],
            "mde": self.mde,
            "problems": self.problems,
            "shared_baseline": self.shared_baseline,
            "verdict": self.verdict,
        }


def compare_paired(
    a: Mapping[int, float],
    b: Mapping[int, float],
    *,
    names: tuple[str, str] = ("a", "b"),
    problems: int | None = None,
    shared_baseline: int = 1,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare per-seed scores ``a`` and ``b`` ({seed: score}) over the seeds both have (NaN
    scores dropped)."""
    seeds = tuple(s for s in sorted(set(a) & set(b)) if not (math.isnan(a[s]) or math.isnan(b[s])))
    d = tuple(a[s] - b[s] for s in seeds)
    n = len(d)
    mean = statistics.fmean(d) if d else math.nan
    se = statistics.stdev(d) / math.sqrt(n) if n >= 2 else math.nan
    low, high = bootstrap_interval(d, resamples=resamples, seed=seed) if n >= 2 else (math.nan,) * 2
    return Comparison(
        a=names[0],
        b=names[1],
        seeds=seeds,
        differences=d,
        mean=mean,
        se=se,
        low=low,
        high=high,
        mde=mde(se, n),
        problems=problems,
        shared_baseline=shared_baseline,
    )


@dataclass(frozen=True)
class RatioInterval:
    """A ratio of two systems' figures over paired rounds, with its 95% interval."""

    ratio: float
    """Geometric mean of the per-round ratios."""
    low: float
    high: float
    """The interval (NaN with fewer than 2 rounds)."""
    rounds: int

    @property
    def half_width(self) -> float:
        """The interval's larger distance from the ratio, relative to it (0.05: about ±5%)."""
        return max(self.high / self.ratio - 1, 1 - self.low / self.ratio)

    def text(self, digits: int = 2) -> str:
        """``1.94x (1.85-2.03)``; just ``1.94x`` with no interval."""
        f = f".{digits}f"
        if math.isnan(self.low):
            return f"{self.ratio:{f}}x"
        return f"{self.ratio:{f}}x ({self.low:{f}}-{self.high:{f}})"

    def to_json(self) -> dict:
        return {
            "ratio": self.ratio,
            "ci95": [self.low, self.high],
            "half_width": self.half_width,
            "rounds": self.rounds,
        }


def ratio_interval(
    numerator: Sequence[float | None],
    denominator: Sequence[float | None],
    *,
    level: float = LEVEL,
) -> RatioInterval | None:
    """``numerator[i] / denominator[i]`` paired by round i (e.g. the baseline's seconds per step
    over the current commit's: above 1 is faster now): the geometric mean of the ratios and the
    t-interval of the mean log-ratio, exp(mean ± t_{n-1} * sd / sqrt(n)). Rounds where either
    figure is missing, NaN or not positive are dropped; None when no round is left."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} numerators but {len(denominator)} denominators")
    logs = [
        math.log(a / b)
        for a, b in zip(numerator, denominator, strict=True)
        if a is not None and b is not None and a > 0 and b > 0  # NaN fails both comparisons
    ]
    n = len(logs)
    if n == 0:
        return None
    mean = statistics.fmean(logs)
    if n < 2:
        return RatioInterval(math.exp(mean), math.nan, math.nan, n)
    half = t_quantile(1 - (1 - level) / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)
