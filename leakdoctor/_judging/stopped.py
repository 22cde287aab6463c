"""Did a growth stop by itself? The judgement the clinic makes during the run (a leak whose growth stopped
is no longer one: clinic.py) and the summary makes again at the end (reporting/_report.py withdraws it),
with the whole-run fits both read. Pure functions on the monitor's series."""

from __future__ import annotations

from typing import Any

import numpy as np

from leakdoctor._base.findings import Finding
from leakdoctor._base.trend import is_material, theil_sen, window_minima
from leakdoctor._reading.monitor import Monitor
from leakdoctor.settings import Settings

#: The summary's whole-run fits use at most this many points of a history (up to 1024): Theil–Sen and
#: Mann–Kendall cost the square of the points, and a snapshot of the summary must cost milliseconds.
FIT_POINTS = 128


def thinned(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most FIT_POINTS points, spread evenly over the steps: the first reading in each of FIT_POINTS
    equal stretches of steps. Readings come densely while the doctor investigates or hurries and sparsely
    when its pace widens (a busy machine), so a fit over every reading would weigh a dense stretch more
    than the long sparse ones: a leak's first hundred steps, read every step, outvoted the slow rest of
    an 800-step run read every 15 steps, and its whole-run rate came out ten times too high."""
    if len(steps) < 2 or steps[-1] <= steps[0]:
        return steps, values
    stretch = np.minimum(((steps - steps[0]) * FIT_POINTS // (steps[-1] - steps[0])).astype(int), FIT_POINTS - 1)
    first = np.flatnonzero(np.diff(stretch, prepend=-1))
    return steps[first], values[first]


def whole_fit(series: Any, settings: Settings, since: int,
              until: int | None = None) -> tuple[float, float, float] | None:
    """Theil–Sen slope and interval of the history in (since, until], where it holds at least two
    windows (fewer: None, and the rate measured at the time stands). Never from before the warm-up ends:
    what the warm-up builds (a Keras fit's model, a first compile) is no slope."""
    steps, values = series.history(since=max(since, settings.warmup), until=until)
    if len(values) < 2 * settings.window:
        return None
    return theil_sen(*thinned(steps, values))


def stopped(finding: Finding, monitor: Monitor, settings: Settings) -> bool:
    """Did the growth stop by itself after detection? Only when the readings since the supposed stop
    (the last 2 * verify_windows window minima, and at least the last third of the run since the growth
    began) show no growth of their own over a stretch long enough to see the old pace: their slope is
    under a quarter of the rate at detection; the upper end of its interval (what they may still grow,
    with confidence) is too little to matter, or at most a quarter of the whole run's pace; and the
    quiet end outlasts the pauses the growth took before (_pausing). A cache that filled may leave a
    material creep (a pool's rarer size classes, filled late; a heap's fragmentation), far slower than
    its filling; a leak keeps its pace, however noisy its readings and whatever the few windows at
    detection said."""
    needed = 2 * settings.verify_windows
    series = monitor.series[finding.metric]
    rate = _series_pace(finding, series, settings)
    steps, _ = series.minima(0, finding.detected_step)
    if len(steps) < needed:  # a metric read rarely (a probe whose cost grew) has a longer stretch to show
        return False
    # and at least the last third of the run since the growth began: resident memory grows in stairs as
    # the heap reuses what it freed, and a stair can outlast a few windows
    third = series.end_step - (series.end_step - finding.first_step) // 3
    recent = min(int(steps[-needed]), max(third, finding.detected_step + 1)) - 1
    after = monitor.trend_since(finding.metric, recent)
    if after.slope > 0.25 * rate:
        return False
    still = max(after.slope, after.slope_high)
    whole = whole_fit(series, settings, since=finding.first_step - 1)
    if is_material(series.spec.unit, still, series.end or 0.0, settings.horizon, series.spec.limit) and \
            (whole is None or still > 0.25 * whole[0]):
        return False  # what still grows matters, at more than a quarter of the run's pace
    found = whole_fit(series, settings, since=finding.first_step - 1, until=finding.detected_step)
    pace = max(found[0] if found else 0.0, rate)
    return not _pausing(series, finding.first_step, pace, settings.window)


def _series_pace(finding: Finding, series: Any, settings: Settings) -> float:
    """The pace the series itself showed until the detection: the finding's rate, unless the series is a
    lower bound (a count that misses events between samples), whose own slope is compared with its own."""
    if not series.spec.lower_bound:
        return finding.rate_per_step
    found = whole_fit(series, settings, since=finding.first_step - 1, until=finding.detected_step)
    return found[0] if found and found[0] > 0 else finding.rate_per_step


def _pausing(series: Any, since: int, pace: float, window: int) -> bool:
    """Is the quiet end no longer than the pauses the growth took before? Resident memory grows in
    stairs (the heap reuses what it freed, then maps more), and a leak whose stairs are a few hundred
    steps apart is still one. A rise is a window minimum (a passing spike is none) two windows' growth (at
    its pace when found) above the last rise, and at least half of what the growth's steady pace (the
    slower of that pace and the run's net growth per step) adds over the gap since: a stair of a leak
    carries its pace, where a bump after an evaluation pass's peak (which the heap keeps) carries a
    fraction of it. The growth paused as long as the longest gap between rises, and it stopped only when
    the readings since its last rise are quiet for more than twice that."""
    steps, values = series.history(since=since)
    if len(values) < 2 or pace <= 0:
        return False
    gap = float(np.median(np.diff(steps)))
    steps, values = window_minima(steps, values, max(1, round(window / gap)))  # a passing spike is no rise
    if len(values) < 2:
        return False
    steady = max(0.0, min(pace, (values[-1] - values[0]) / max(1, steps[-1] - steps[0])))
    top, last, gaps = values[0], int(steps[0]), []
    for step, value in zip(steps[1:].tolist(), values[1:].tolist()):
        if value >= top + max(2 * window * pace, 0.5 * steady * (step - last)):
            gaps.append(step - last)
            top, last = value, step
    return int(steps[-1]) - last <= 2 * max(gaps, default=0)
