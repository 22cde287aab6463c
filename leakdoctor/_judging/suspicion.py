"""When a metric is suspect: on each window close, its recent window minima grow significantly (_base/trend.assess)
at a rate that is material over the horizon, and it is free to investigate. The reading (_reading/monitor.py)
keeps the series and says which metrics are free; the clinic asks this on every window that closed."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from leakdoctor._base.trend import SCALES, Trend, assess, is_material, onset, slope_bound
from leakdoctor._reading.monitor import Monitor
from leakdoctor._reading.series import Series

__all__ = ["Suspicion"]


class Suspicion:
    """The suspicion decision over one monitor's series."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def of(self, metric: str, levels: Iterable[int]) -> Trend | None:
        """A growing, material trend of a primary metric that is free to investigate, else None."""
        monitor = self.monitor
        if not monitor.free_to_investigate(metric):
            return None
        series = monitor.series[metric]
        since = monitor.baseline(metric)
        alpha = monitor.settings.alpha
        for level in levels:
            if not _new_high(series.levels[level], since) or not self._could_matter(series, level, since):
                continue
            steps, minima = series.minima(level, since)
            trend = assess(steps, minima, alpha, fit_flat=False)
            if trend.growing and is_material(series.spec.unit, trend.slope, series.end or 0.0,
                                             monitor.settings.horizon, series.spec.limit):
                return dataclasses.replace(trend, onset_step=onset(steps, minima))
        return None

    def _could_matter(self, series: Series, level: int, since: int) -> bool:
        """Could the level's minima grow at a rate that matters, at any scale the detector tests? On the
        bound of the Theil–Sen slope (_base/trend.slope_bound), without numpy: the statistics, which a window
        close that sets a new high would run, cost ten times more, and a clean run's resident memory
        creeps up by a page now and then."""
        entries = [e for e in series.levels[level] if e[0] > since]
        spec, level_now, horizon = series.spec, series.end or 0.0, self.monitor.settings.horizon
        for k in SCALES:
            if k > len(entries):
                break
            steps, values = zip(*entries[-k:])
            if is_material(spec.unit, slope_bound(steps, values), level_now, horizon, spec.limit):
                return True
        return False


def _new_high(entries: Sequence[tuple[int, float]], since: int) -> bool:
    """Cheap pre-check: enough minima after `since`, the newest above the previous few. A growing
    series passes nearly every window; a flat or noisy one rarely does, and skips the statistics."""
    count = SCALES[0]
    if len(entries) < count or entries[-count][0] <= since:
        return False
    newest = entries[-1][1]
    return all(newest > entries[-i][1] for i in range(2, count + 1))
