"""Trend statistics for memory series. Pure functions on arrays; no framework imports.

The detector answers one question per metric: is this series still growing, how fast, and since when?
It works on per-window minima, which ignore periodic spikes and transient allocations. It tests for a
monotonic trend with Mann–Kendall (the exact distribution for small samples, a tie-corrected normal
approximation otherwise) and estimates the slope with Theil–Sen and Sen's confidence interval. Both
are rank-based, so one outlier cannot make a leak.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

__all__ = ["GROWING", "FLAT", "PLATEAU", "SCALES", "MIN_SIGNAL_TO_NOISE", "Trend", "window_minima",
           "mann_kendall", "theil_sen", "slope_bound", "onset_index", "assess", "above_noise", "onset",
           "classify", "is_material", "steps_to_limit"]

GROWING = "growing"
FLAT = "flat"
PLATEAU = "plateau"

#: Window counts at which the most recent minima are tested, shortest first: a fast leak is seen at
#: the first scale, a slow leak under noise at a longer one.
SCALES = (6, 12, 24, 48)
#: A growth must rise at least this many times the robust scatter of the minima around its line.
MIN_SIGNAL_TO_NOISE = 4.0
_EXACT_MAX_N = 12


@dataclass(frozen=True)
class Trend:
    """What the detector concluded about one stretch of a series."""

    kind: str
    slope: float = 0.0
    slope_low: float = 0.0
    slope_high: float = 0.0
    p_value: float = 1.0
    onset_step: int | None = None
    windows: int = 0
    first: float = 0.0  # the first window minimum fitted, and the steps the fit spans (Monitor.trend_since)
    span: int = 0

    @property
    def growing(self) -> bool:
        return self.kind == GROWING


def window_minima(steps: Sequence[int], values: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Minimum of each full window of `size` samples, with the step at which it occurred."""
    count = len(values) // size
    if count == 0:
        return np.empty(0, dtype=np.int64), np.empty(0)
    v = np.asarray(values[: count * size], dtype=float).reshape(count, size)
    s = np.asarray(steps[: count * size], dtype=np.int64).reshape(count, size)
    rows = np.arange(count)
    at = v.argmin(axis=1)
    return s[rows, at], v[rows, at]


# The detector runs on short arrays (at most 48 minima) inside the sampled steps, where numpy's
# per-call overhead, not arithmetic, is the cost: index pairs are cached and medians taken by sorting.

#: Index pairs are cached up to this many items (the detector's minima); longer stretches (the summary's)
#: compute theirs, since a cache of every length would keep megabytes per length for good.
_CACHED_PAIRS = 64


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (i, j) of every pair i < j of n items."""
    return _cached_pairs(n) if n <= _CACHED_PAIRS else np.triu_indices(n, 1)


@lru_cache(maxsize=_CACHED_PAIRS)
def _cached_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, 1)


def _median_of_sorted(values: Sequence[float]) -> float:
    n = len(values)
    return float(values[(n - 1) // 2] + values[n // 2]) / 2.0


def _tie_sizes(y: np.ndarray) -> np.ndarray:
    """Sizes of the groups of equal values that have more than one member."""
    ordered = np.sort(y)
    equal = ordered[1:] == ordered[:-1]
    if not equal.any():
        return np.empty(0, dtype=np.int64)
    edges = np.flatnonzero(np.diff(np.concatenate(([False], equal, [False])).astype(np.int8)))
    return edges[1::2] - edges[::2] + 1


@lru_cache(maxsize=_EXACT_MAX_N + 1)  # called for n <= _EXACT_MAX_N only
def _inversion_cdf(n: int) -> tuple[float, ...]:
    """P(inversions <= k) for a random permutation of n items (Mahonian numbers)."""
    counts = [1]
    for m in range(2, n + 1):
        nxt = [0] * (len(counts) + m - 1)
        for k, c in enumerate(counts):
            for j in range(m):
                nxt[k + j] += c
        counts = nxt
    total = math.factorial(n)
    return tuple(np.cumsum(counts) / total)


#: Up to this many points the statistics run in plain Python: at the 6 to 12 minima tested whenever a
#: window closes, numpy's per-call overhead costs more than the arithmetic.
_SMALL = 12


def _as_list(values: Sequence[float]) -> list[float]:
    return values.tolist() if isinstance(values, np.ndarray) else [float(v) for v in values]


def _mann_kendall_small(y: list[float]) -> tuple[float, float]:
    n = len(y)
    s = 0
    for i in range(n - 1):
        yi = y[i]
        for yj in y[i + 1:]:
            s += (yj > yi) - (yj < yi)
    if len(set(y)) == n:  # no ties: the exact distribution
        return float(s), float(_inversion_cdf(n)[(n * (n - 1) // 2 - s) // 2])
    if s <= 0:
        return float(s), 1.0
    ties = [c for c in Counter(y).values() if c > 1]
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18.0
    if var <= 0:
        return float(s), 1.0
    return float(s), 0.5 * math.erfc((s - 1.0) / math.sqrt(var) / math.sqrt(2.0))


def mann_kendall(y: Sequence[float]) -> tuple[float, float]:
    """Mann–Kendall S and its one-sided p-value for an increasing trend."""
    n = len(y)
    if n < 3:
        return 0.0, 1.0
    if n <= _SMALL:
        return _mann_kendall_small(_as_list(y))
    y = np.asarray(y, dtype=float)
    i, j = _pairs(n)
    s = float(np.sign(y[j] - y[i]).sum())
    ties = _tie_sizes(y)
    if len(ties) == 0 and n <= _EXACT_MAX_N:
        pairs = n * (n - 1) // 2
        inversions = int(round((pairs - s) / 2))
        return s, float(_inversion_cdf(n)[inversions])
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(ties * (ties - 1) * (2 * ties + 5)))) / 18.0
    if s <= 0 or var <= 0:
        return s, 1.0
    z = (s - 1.0) / math.sqrt(var)
    return s, 0.5 * math.erfc(z / math.sqrt(2.0))


def theil_sen(x: Sequence[float], y: Sequence[float], z: float = 1.96) -> tuple[float, float, float]:
    """Median pairwise slope and Sen's confidence interval (z = 1.96 for 95%)."""
    n = len(y)
    if n < 2:
        return 0.0, 0.0, 0.0
    if n <= _SMALL:
        xs, ys = _as_list(x), _as_list(y)
        slopes = sorted((ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n) if xs[j] != xs[i])
    else:
        xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        i, j = _pairs(n)
        dx = xa[j] - xa[i]
        keep = dx != 0
        slopes = np.sort((ya[j] - ya[i])[keep] / dx[keep])
    m = len(slopes)
    if m == 0:
        return 0.0, 0.0, 0.0
    spread = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    low = slopes[max(0, int(math.floor((m - spread) / 2)))]
    high = slopes[min(m - 1, int(math.ceil((m + spread) / 2)))]
    return _median_of_sorted(slopes), float(low), float(high)


def slope_bound(steps: Sequence[float], values: Sequence[float]) -> float:
    """An upper bound on the Theil–Sen slope of the points, in O(n) and without numpy. If the median of
    the pairwise slopes is m, the upper half of them are at least m; the pairs whose index gap is below
    some G are fewer than that half, so one pair at least G apart rises at m or more, and no pair rises
    more than the range of the values. The detector asks it on every window close that sets a new high,
    so that a series whose growth cannot matter skips the statistics."""
    n = len(values)
    rise = max(values) - min(values) if n > 1 else 0.0
    if rise <= 0:
        return 0.0
    pairs = n * (n - 1) // 2
    upper = pairs - pairs // 2  # slopes at or above the median's upper middle
    gap, shorter = 1, 0  # `shorter`: the pairs less than `gap` apart
    while shorter + n - gap < upper:
        shorter += n - gap
        gap += 1
    span = min(steps[i + gap] - steps[i] for i in range(n - gap))
    return rise / span if span > 0 else math.inf


def onset_index(y: Sequence[float]) -> int:
    """Index where a flat-then-linear (hinge) least-squares fit to `y` breaks; all breaks at once."""
    y = np.asarray(y, dtype=float)
    n = len(y)
    if n < 4:
        return 0
    breaks = np.arange(n - 2)[:, None]
    t = np.maximum(np.arange(n)[None, :] - breaks, 0).astype(float)
    tc = t - t.mean(axis=1, keepdims=True)
    yc = y - y.mean()
    slope = (tc @ yc) / np.einsum("ij,ij->i", tc, tc)
    sse = np.sum((yc[None, :] - slope[:, None] * tc) ** 2, axis=1)
    return int(np.argmin(np.round(sse, 9)))


def assess(steps: Sequence[int], minima: Sequence[float], alpha: float, scales: Sequence[int] = SCALES,
           fit_flat: bool = True) -> Trend:
    """Is the recent part of a series of window minima growing? Tests each scale, shortest first.

    `alpha` is the false-alarm rate for one call, split evenly (Bonferroni) across the scales. The onset
    is left to `onset`, which callers run only when the trend matters. `fit_flat=False`: a stretch that
    is not growing gets no slope (the detector's question on every window close is only whether it grows,
    and the fit costs as much as the test).
    """
    steps = np.asarray(steps, dtype=np.int64)
    minima = np.asarray(minima, dtype=float)
    n = len(minima)
    tested = [k for k in scales if k <= n]
    if not tested:
        return Trend(FLAT, windows=n)
    level = alpha / len(scales)
    for k in tested:
        _, p = mann_kendall(minima[-k:])
        fit = p < level or (fit_flat and k == tested[-1])
        slope, low, high = theil_sen(steps[-k:], minima[-k:]) if fit else (0.0, 0.0, 0.0)
        if p < level and slope > 0 and above_noise(steps[-k:], minima[-k:], slope):
            return Trend(GROWING, slope, low, high, p, None, k)
    return Trend(FLAT, slope, low, high, p, None, tested[-1])


def above_noise(steps: np.ndarray, minima: np.ndarray, slope: float) -> bool:
    """Does the rise over the stretch stand out from the scatter around the fitted line? A chance
    ordering of large noise can be significant; it does not rise MIN_SIGNAL_TO_NOISE times its MAD."""
    residuals = sorted(_as_list(minima - slope * steps))
    centre = _median_of_sorted(residuals)
    scatter = 1.4826 * _median_of_sorted(sorted(abs(r - centre) for r in residuals))
    return slope * float(steps[-1] - steps[0]) >= MIN_SIGNAL_TO_NOISE * scatter


def onset(steps: Sequence[int], minima: Sequence[float]) -> int:
    """The step at which growth began: the break of a hinge fit over (at most) the last 192 minima."""
    start = max(0, len(minima) - 4 * SCALES[-1])
    return int(np.asarray(steps)[start:][onset_index(np.asarray(minima)[start:])])


def classify(steps: Sequence[int], values: Sequence[float], window: int, alpha: float) -> Trend:
    """Whole-run trend of a series: growing at the end, grew then stopped (plateau), or flat."""
    wsteps, minima = window_minima(steps, values, window)
    recent = assess(wsteps, minima, alpha)
    if recent.growing:
        return recent
    if len(minima) >= SCALES[0]:
        _, p = mann_kendall(minima)
        slope, low, high = theil_sen(wsteps, minima)
        if p < alpha and low > 0:
            # grew over the run; stopped only where the recent stretch shows no growth of its own (not
            # significant at alpha, or its slope's interval reaches zero): noise can keep a rise that goes
            # on from passing the detector's stricter test (alpha split over the scales, and the rise
            # MIN_SIGNAL_TO_NOISE times the scatter), as the Burn case's step time under a changing load
            kind = GROWING if recent.slope_low > 0 and recent.p_value < alpha else PLATEAU
            return Trend(kind, slope, low, high, p, None, len(minima))
    return recent


def is_material(unit: str, slope: float, level: float, horizon: int, limit: float | None) -> bool:
    """Does a slope matter over the horizon? Bytes: the projected growth takes at least a tenth of the
    headroom to the limit (and 16 MiB). Counts: it at least doubles the level. Seconds: it adds half."""
    growth = slope * horizon
    if unit == "bytes":
        headroom = (limit - level) if limit else level
        return growth >= max(16 * 2**20, 0.1 * max(headroom, 0.0))
    if unit == "seconds":
        return growth >= 0.5 * abs(level)
    return growth >= max(1.0, abs(level))


def steps_to_limit(level: float, slope: float, limit: float | None) -> float | None:
    """Steps until `level` growing at `slope` reaches `limit`; None when it never does."""
    if not limit or slope <= 0:
        return None
    return max(0.0, (limit - level) / slope)
