"""Per-metric detection state: the series, each metric's baseline, and which metrics are free to investigate.

It only reads and reports: whether a metric is suspect (its recent window minima grow significantly at a rate
that is material over the horizon) is the judging's decision (_judging/suspicion.py), made on what this
reports. Metrics under investigation or verification are busy; metrics whose leak has no remedy (left) are
quiet (reported once, not investigated again). A remedy moves the baseline,
so only samples after it count; a suspicion that ended benign or dismissed, or a benign finding whose
remedy did not stop the growth (it may not be the cache it was taken for), cools the metric down,
each time for twice as long, so growth that is not a leak cannot trigger investigations over and over.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Mapping

from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.trend import SCALES, Trend, assess, theil_sen
from leakdoctor._reading.series import Series
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

    def free_to_investigate(self, metric: str) -> bool:
        """A primary metric that is not busy (under investigation or verification), not quiet (a leak with no
        remedy, reported once) and not cooling down: one whose growth may raise a suspicion (_judging/suspicion.py)."""
        series = self.series[metric]
        return series.spec.role == "primary" and metric not in self._busy and metric not in self._quiet \
            and series.end_step >= self._cool_until.get(metric, 0)

    def baseline(self, metric: str) -> int:
        """The step after which a metric's samples count (a remedy or an investigation moves it)."""
        return self._since.get(metric, 0)

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
