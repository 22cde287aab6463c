"""The last look, at finish(): a run can end with a series that grew too slowly, or for too few steps, to
raise a suspicion (a 1,200-step loop keeping `total_loss += loss` with its graph: resident memory grew 15 MB,
11.7 KiB a step, and the run ended clean with no finding), while what is alive at its end proves the cause.
One bounded check, only where a series grew over the run (the whole-run Theil–Sen slope's interval above
zero after warm-up) and no finding explains it: each integration's last look (a snapshot of what it can
prove at once; torch: autograd graphs chained across steps, or kept one a step in a container, by a named
place), its findings added to the clinic's, on the series' whole-run rate. The summary judges them as any
other (reporting/_report.py): a proven cause too slow to matter is minor, listed at its line; the verdict stays clean.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from leakdoctor._base.findings import Finding
from leakdoctor._base.trend import theil_sen
from leakdoctor._judging.clinic import Clinic
from leakdoctor._judging.stopped import thinned, whole_fit
from leakdoctor._reading.monitor import Monitor
from leakdoctor.settings import Settings

LastLook = Callable[[int], list[Finding]]
#: The fewest readings after warm-up whose slope says a series grew.
MIN_READINGS = 8


def grown(monitor: Monitor, settings: Settings) -> list[str]:
    """The series (bytes and counts) that grew over the run after warm-up: the lower end of their whole-run
    slope's interval above zero, over at least two windows of steps (and MIN_READINGS readings)."""
    names = []
    for name, series in monitor.series.items():
        if series.spec.unit == "seconds":
            continue
        steps, values = series.history(since=settings.warmup)
        if len(values) < MIN_READINGS or steps[-1] - steps[0] < 2 * settings.window:
            continue
        _, low, _ = theil_sen(*thinned(steps, values))
        if low > 0 and values[-1] > values[0]:
            names.append(name)
    return names


def conclude(clinic: Clinic, monitor: Monitor, settings: Settings, looks: Sequence[LastLook], step: int) -> None:
    """At finish(): where a series grew and no finding explains it, look once (each integration's last
    look) and add what it proves to the clinic's findings, from the end of the warm-up, found at this step."""
    steps = step - settings.warmup
    if not looks or steps < 2 * settings.window:
        return
    explained = {metric for f in clinic.findings for metric in f.explains}
    if not [name for name in grown(monitor, settings) if name not in explained]:
        return
    known = {f.key for f in clinic.findings}
    for look in looks:
        for found in clinic.guard.call("last look", look, steps, default=None) or []:
            series = monitor.series.get(found.metric)
            if found.key in known or series is None:
                continue
            fit = whole_fit(series, settings, since=settings.warmup)
            rate = fit[0] if fit else 0.0
            clinic.findings.append(dataclasses.replace(
                found, first_step=settings.warmup + 1, detected_step=step, rate_per_step=rate, detected_rate=rate,
                rate_interval=fit[1:] if fit else None))
            known.add(found.key)
