"""How every benchmark table summarises repeated measurements (paired speedups, step times):
the median, the smallest and largest value, and a confidence interval for the median.

The interval is distribution-free: two order statistics, the j-th smallest and the j-th largest
of n values. The true median lies below the j-th smallest value only when at most j - 1 of the
values fall below it, and for independent draws that count is Binomial(n, 1/2) whatever their
distribution. So the interval misses with probability 2 P(Binomial(n, 1/2) <= j - 1). We take
the narrowest interval (the largest j) whose coverage is still at least LEVEL: with 11 values,
the 2nd and the 10th, covering 98.8 %. Under 6 values no pair of order statistics reaches 95 %,
and there is no interval; min and max are printed regardless.

The draws must be independent for the coverage to hold. A slow spell of the machine that spans
several rotations breaks that, which is why the ratios are paired within a rotation first.
"""

from __future__ import annotations

import math
import statistics

LEVEL = 0.95


def median_interval(values: list[float], level: float = LEVEL) -> dict | None:
    """{"low", "high", "coverage"}: the narrowest order-statistic interval for the median whose
    coverage is at least `level`, or None when even (min, max) falls short."""
    n, ordered = len(values), sorted(values)
    found = None
    for j in range(1, (n + 1) // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
        if coverage < level:
            break
        found = {"low": ordered[j - 1], "high": ordered[n - j], "coverage": coverage}
    return found


def spread(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "interval": median_interval(values),
    }


def format_spread(s: dict, unit: str = "x", digits: int = 2) -> str:
    """'1.16x [1.01-1.26] (0.90-1.30)': median [interval, when there is one] (min-max)."""
    interval = s.get("interval")  # absent in results written before intervals were printed
    text = f"{s['median']:.{digits}f}{unit}"
    if interval:
        text += f" [{interval['low']:.{digits}f}-{interval['high']:.{digits}f}]"
    return text + f" ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
