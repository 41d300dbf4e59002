"""Percentiles, medians and slopes (plain lists; None and empty handled as the reports need)."""

import math
import statistics


def pct(values, q):
    """Nearest-rank percentile (q in 0..100); None when empty."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, math.ceil(q / 100 * len(v)) - 1)
    return v[k]


def median(xs):
    """The median of the values that are not None; None when there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def slope(xs, ys):
    """Least-squares slope of ys over xs (0.0 with fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0
