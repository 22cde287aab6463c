"""The trend statistics on synthetic series (pure functions, no training loop)."""

import itertools
import math

import numpy as np
import pytest

from leakdoctor.integrations import MetricSpec
from leakdoctor._base.trend import (FLAT, GROWING, PLATEAU, assess, classify, is_material, mann_kendall, onset_index,
                                       slope_bound, steps_to_limit, theil_sen, window_minima)
from leakdoctor._judging.suspicion import Suspicion
from leakdoctor._reading.monitor import Monitor
from leakdoctor.settings import Settings


def brute_force_p(y):
    """P(S >= s) over all orderings of y: the exact null distribution of Mann–Kendall."""
    s = mann_kendall(y)[0]
    count = total = 0
    for perm in itertools.permutations(y):
        total += 1
        count += mann_kendall(perm)[0] >= s
    return count / total


@pytest.mark.parametrize("y", [[1, 2, 3, 4, 5, 6], [1, 3, 2, 4, 6, 5], [3, 1, 2, 6, 4, 5], [6, 5, 4, 3, 2, 1]])
def test_mann_kendall_exact_matches_permutations(y):
    assert mann_kendall(np.array(y, float))[1] == pytest.approx(brute_force_p(y))


def test_mann_kendall_normal_approximation_with_ties():
    rising = np.repeat(np.arange(10.0), 3)  # ties in every group of three
    assert mann_kendall(rising)[1] < 1e-6
    assert mann_kendall(rising[::-1])[1] == 1.0
    assert mann_kendall(np.ones(30))[1] == 1.0


def test_theil_sen_ignores_outliers():
    x = np.arange(40.0)
    y = 2 * x + 1
    y[::5] += 500  # every fifth point is an outlier
    slope, low, high = theil_sen(x, y)
    assert slope == pytest.approx(2.0)
    assert low <= slope <= high


def test_onset_of_flat_then_linear():
    y = np.r_[np.zeros(20), np.arange(1, 21) * 3.0]
    assert onset_index(y) in (19, 20)
    assert onset_index(np.arange(30.0)) == 0


def test_window_minima_ignore_spikes():
    steps = np.arange(60)
    values = np.full(60, 100.0)
    values[::10] = 1e6  # a spike every 10 steps
    _, minima = window_minima(steps, values, 5)
    assert np.all(minima == 100.0)


def test_assess_growing_flat_and_noise():
    rng = np.random.default_rng(1)
    steps = np.arange(48) * 6
    noise = rng.normal(0, 50e3, 48)
    leak = assess(steps, 100e6 + 20e3 * steps + noise, alpha=0.01)
    assert leak.kind == GROWING and leak.slope == pytest.approx(20e3, rel=0.2)
    assert assess(steps, 100e6 + noise, alpha=0.01).kind == FLAT
    assert assess(steps[:5], steps[:5] * 1.0, alpha=0.01).kind == FLAT  # too few windows to tell


def test_classify_plateau():
    steps = np.arange(600)
    values = np.minimum(steps, 200) * 10e3 + 50e6  # a cache that fills, then stays
    assert classify(steps, values, window=6, alpha=0.01).kind == PLATEAU
    assert classify(steps, 50e6 + steps * 10e3, window=6, alpha=0.01).kind == GROWING


def test_classify_a_noisy_rise_that_goes_on_as_growing_and_a_noisy_fill_that_stopped_as_plateau():
    """The summary's word for a series at the end of the run: a step time rising linearly under 25%
    noise (the Burn test's, on a shared machine) was often 'plateau', since the last windows' rise did not
    pass the detector's own test; 'plateau' needs the recent stretch to show no growth of its own."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        steps = np.arange(20, 500)
        rising = (16e-3 + 0.09e-3 * steps) * rng.lognormal(0, 0.25, len(steps))
        assert classify(steps, rising, window=6, alpha=0.01).kind == GROWING, seed
        steps = np.arange(600)
        filled = (np.minimum(steps, 200) * 10e3 + 50e6) * rng.lognormal(0, 0.02, len(steps))
        assert classify(steps, filled, window=6, alpha=0.01).kind == PLATEAU, seed


def test_materiality():
    gib = 2**30
    assert is_material("bytes", 100e3, 1 * gib, horizon=100_000, limit=24 * gib)
    assert not is_material("bytes", 1e3, 1 * gib, horizon=100_000, limit=24 * gib)
    assert is_material("count", 1.0, 10, horizon=100_000, limit=None)
    assert not is_material("count", 1e-5, 10, horizon=100_000, limit=None)
    assert is_material("seconds", 1e-6, 1e-3, horizon=100_000, limit=None)


def test_steps_to_limit():
    assert steps_to_limit(1000.0, 10.0, 2000.0) == 100.0
    assert steps_to_limit(1000.0, 0.0, 2000.0) is None
    assert steps_to_limit(1000.0, 10.0, None) is None
    assert math.isclose(steps_to_limit(3000.0, 10.0, 2000.0), 0.0)


def _series(rng, n, kind):
    """Window minima of the kinds a detector sees: noise, noise with ties, a staircase, a noisy rise."""
    if kind == 0:
        return rng.normal(0, 1, n)
    if kind == 1:
        return np.round(rng.normal(0, 1, n))
    if kind == 2:
        return np.maximum.accumulate(np.round(rng.normal(0, 1, n)))
    return np.arange(n) * rng.random() + rng.normal(0, 0.3, n)


def test_slope_bound_is_never_below_the_theil_sen_slope():
    """The detector skips the statistics when even this bound is not material, so it must hold always."""
    rng = np.random.default_rng(7)
    for trial in range(4000):
        n = int(rng.integers(2, 49))
        steps = np.cumsum(rng.integers(1, 20, n)).astype(float)
        values = _series(rng, n, trial % 4)
        assert theil_sen(steps, values)[0] <= slope_bound(steps.tolist(), values.tolist()) + 1e-12, trial
    assert slope_bound([1, 2, 3], [5.0, 5.0, 5.0]) == 0.0
    assert slope_bound([1, 2, 3, 4], [0.0, 1.0, 2.0, 3.0]) >= 1.0  # a straight line: at least its slope


def test_assess_without_the_flat_fit_reaches_the_same_verdict():
    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(6, 49))
        steps = np.arange(n) * 6
        values = _series(rng, n, trial % 4)
        full, lean = assess(steps, values, 0.01), assess(steps, values, 0.01, fit_flat=False)
        assert lean.kind == full.kind, trial
        if full.growing:
            assert lean == full


def test_the_detector_skips_the_statistics_only_where_no_suspicion_could_come_of_them():
    """A window close runs the statistics only when a Theil–Sen slope could be material; with the check
    switched off, every close of every kind of series (noise, creeping by a page now and then, leaking)
    reaches the same suspicion, and the check does skip the statistics of the first two."""
    rng = np.random.default_rng(11)
    settings = Settings.create(warmup=0)
    spec = MetricSpec("rss_bytes", "bytes", limit=8 * 2**30)
    suspicions, skips = [0, 0, 0], [0, 0, 0]
    for trial in range(24):
        kind = trial % 3
        gated, full = Suspicion(Monitor(settings)), Suspicion(Monitor(settings))
        full._could_matter = lambda *args: True
        could_matter = gated._could_matter

        def counted(*args, kind=kind, could_matter=could_matter):
            matters = could_matter(*args)
            skips[kind] += not matters
            return matters

        gated._could_matter = counted
        for step in range(1, 600):
            value = 1e9 + rng.normal(0, 20e3) if kind == 0 else \
                1e9 + 4096 * (step // 37) if kind == 1 else 1e9 + 100e3 * max(0, step - 200)
            found = []
            for suspicion in (gated, full):
                completed = suspicion.monitor.record(step, {"rss_bytes": value}, lambda metric: spec)
                found.append(suspicion.of("rss_bytes", completed["rss_bytes"]) if completed else None)
            assert found[0] == found[1], (trial, step)
            if found[0] is not None:  # investigated: both watch again from here
                suspicions[kind] += 1
                gated.monitor.watch(["rss_bytes"], step)
                full.monitor.watch(["rss_bytes"], step)
    assert suspicions[0] == suspicions[1] == 0 and suspicions[2] >= 8
    assert skips[0] > 0 and skips[1] > 0
