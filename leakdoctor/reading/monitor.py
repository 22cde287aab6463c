"""Per-metric detection state: the series, each metric's baseline, and when a metric is suspect.

A metric is suspect when its recent window minima grow significantly (base/trend.assess) at a rate that is
material over the horizon. Metrics under investigation or verification are busy; metrics whose leak
has no remedy (left) are quiet (reported once, not investigated again). A remedy moves the baseline,
so only samples after it count; a suspicion that ended benign or dismissed, or a benign finding whose
remedy did not stop the growth (it may not be the cache it was taken for), cools the metric down,
each time for twice as long, so growth that is not a leak cannot trigger investigations over and over.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Mapping, Sequence

from leakdoctor.base.metric import MetricSpec
from leakdoctor.base.trend import SCALES, Trend, assess, is_material, onset, slope_bound, theil_sen
from leakdoctor.reading.series import Series
from leakdoctor.settings import Settings


#: Window minima that must each rise for `rising` (by chance, about one window close in 24 of a noisy
#: flat series).
RISING = 3


class Monitor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.series: dict[str, Series] = {}
        self._since: dict[str, int] = {}
        self._busy: set[str] = set()
        self._quiet: set[str] = set()
        self._cool_until: dict[str, int] = {}
        self._cool_gap: dict[str, int] = {}
        self.skipped: dict[str, list[int]] = {}  # metric: [first step, count] of NaN/inf readings left out
        assess(range(SCALES[0]), range(SCALES[0]), settings.alpha)  # numpy's first median costs ~10 ms

    def record(self, step: int, readings: Mapping[str, float], spec_of: Callable[[str], MetricSpec],
               next_step: int | None = None) -> dict[str, list[int]]:
        """Add one step's readings; return {metric: pyramid levels that completed a window}. `next_step`:
        when the next sample is due (a window whose last sample this is closes now, see Series.add)."""
        completed = {}
        for metric, value in readings.items():
            if not math.isfinite(value):  # a NaN or inf reading would poison the statistics: left out
                self.skipped.setdefault(metric, [step, 0])[1] += 1
                continue
            series = self.series.get(metric)
            if series is None:
                series = self.series[metric] = Series(spec_of(metric), self.settings.window, self.settings.warmup)
            levels = series.add(step, value, next_step)
            if levels:
                completed[metric] = levels
        return completed

    def suspicion(self, metric: str, levels: Iterable[int]) -> Trend | None:
        """A growing, material trend of a primary metric that is free to investigate, else None."""
        series = self.series[metric]
        if series.spec.role != "primary" or metric in self._busy or metric in self._quiet \
                or series.end_step < self._cool_until.get(metric, 0):
            return None
        since = self._since.get(metric, 0)
        alpha = self.settings.alpha
        for level in levels:
            if not _new_high(series.levels[level], since) or not self._could_matter(series, level, since):
                continue
            steps, minima = series.minima(level, since)
            trend = assess(steps, minima, alpha, fit_flat=False)
            if trend.growing and is_material(series.spec.unit, trend.slope, series.end or 0.0,
                                             self.settings.horizon, series.spec.limit):
                return dataclasses.replace(trend, onset_step=onset(steps, minima))
        return None

    def _could_matter(self, series: Series, level: int, since: int) -> bool:
        """Could the level's minima grow at a rate that matters, at any scale the detector tests? On the
        bound of the Theil–Sen slope (base/trend.slope_bound), without numpy: the statistics, which a window
        close that sets a new high would run, cost ten times more, and a clean run's resident memory
        creeps up by a page now and then."""
        entries = [e for e in series.levels[level] if e[0] > since]
        spec, level_now, horizon = series.spec, series.end or 0.0, self.settings.horizon
        for k in SCALES:
            if k > len(entries):
                break
            steps, values = zip(*entries[-k:])
            if is_material(spec.unit, slope_bound(steps, values), level_now, horizon, spec.limit):
                return True
        return False

    def rising(self, completed: Mapping[str, list[int]]) -> bool:
        """Cheap early sign: a primary metric free to investigate whose last RISING window minima each
        rose above the one before (a growth that may become a suspicion once enough windows close)."""
        for metric, levels in completed.items():
            series = self.series[metric]
            if 0 not in levels or series.spec.role != "primary" or metric in self._busy or metric in self._quiet:
                continue
            entries = series.levels[0]
            if len(entries) > RISING and all(entries[-i][1] > entries[-i - 1][1] for i in range(1, RISING + 1)):
                return True
        return False

    def trend_since(self, metric: str, since: int) -> Trend:
        """Trend of the level-0 minima after `since`; its slope is fitted over all of them."""
        steps, minima = self.series[metric].minima(0, since)
        trend = assess(steps, minima, self.settings.alpha)
        return dataclasses.replace(trend, slope=theil_sen(steps, minima)[0], windows=len(minima),
                                   first=float(minima[0]) if len(minima) else 0.0,
                                   span=int(steps[-1] - steps[0]) if len(steps) else 0)

    def windows_since(self, metric: str, since: int) -> int:
        return len(self.series[metric].minima(0, since)[1]) if metric in self.series else 0

    def trends(self) -> dict[str, Trend]:
        """Current level-0 trend of every metric since its baseline (for diagnosis)."""
        return {m: self.trend_since(m, self._since.get(m, 0)) for m in self.series}

    def watch(self, metrics: Iterable[str], since: int) -> None:
        """Watch again from step `since` on."""
        for m in metrics:
            self._since[m] = since
            self._busy.discard(m)
            self._quiet.discard(m)

    def cool(self, metrics: Iterable[str], step: int) -> None:
        """Watch again from `step`, but raise no suspicion for a while, twice as long each time."""
        for m in metrics:
            gap = self._cool_gap.get(m, self.settings.window * SCALES[0])
            self._cool_gap[m] = 2 * gap
            self._cool_until[m] = step + gap
        self.watch(metrics, step)

    def busy(self, metrics: Iterable[str]) -> None:
        self._busy.update(metrics)

    def free(self, metrics: Iterable[str]) -> None:
        """No longer busy, watched on from the same baseline (a triage that handed them on)."""
        self._busy.difference_update(metrics)

    def quiet(self, metrics: Iterable[str]) -> None:
        self._busy.difference_update(metrics)
        self._quiet.update(metrics)


def _new_high(entries: Sequence[tuple[int, float]], since: int) -> bool:
    """Cheap pre-check: enough minima after `since`, the newest above the previous few. A growing
    series passes nearly every window; a flat or noisy one rarely does, and skips the statistics."""
    count = SCALES[0]
    if len(entries) < count or entries[-count][0] <= since:
        return False
    newest = entries[-1][1]
    return all(newest > entries[-i][1] for i in range(2, count + 1))
