"""The end-of-run summary, built from what the monitor and the clinic hold. Pure functions: they read
the run's state and return new objects, so a snapshot in the middle of a run changes nothing."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from leakdoctor.detect import classify, is_material, steps_to_limit, theil_sen
from leakdoctor.monitor import Monitor
from leakdoctor.settings import Settings
from leakdoctor.summary import Finding, SeriesSummary


def final_findings(findings: list[Finding], monitor: Monitor, settings: Settings) -> tuple[list[Finding], list[str]]:
    """Copies of the findings with rates refit over the whole run; growth that stopped on its own
    (no remedy) is dropped from the findings and noted instead."""
    final, notes = [], []
    for finding in findings:
        copy = dataclasses.replace(finding, remedy=dataclasses.replace(finding.remedy) if finding.remedy else None)
        series = monitor.series.get(finding.metric)
        if series is not None and not (copy.remedy and copy.remedy.effective):
            until = copy.remedy.applied_step if copy.remedy else None
            steps, values = series.history(since=finding.first_step - 1, until=until)
            if len(values) >= 2 * settings.window:
                rate, low, high = theil_sen(steps, values)
                copy.rate_per_step, copy.rate_interval = rate, (low, high)
            if copy.remedy is None and stopped(finding, monitor, settings):
                notes.append(stopped_note(finding, findings))
                continue
        final.append(copy)
    return final, notes


def stopped(finding: Finding, monitor: Monitor, settings: Settings) -> bool:
    """Did the growth stop by itself after detection (enough windows, and no significant trend)?"""
    if monitor.windows_since(finding.metric, finding.detected_step) < 2 * settings.verify_windows:
        return False
    after = monitor.trend_since(finding.metric, finding.detected_step)
    return not after.growing and after.slope <= 0.25 * finding.rate_per_step


def stopped_note(finding: Finding, findings: list[Finding]) -> str:
    """Why a growth that stopped is not reported: a remedy applied for another finding on the same
    metric stopped it, or it stopped by itself."""
    head = f"{finding.metric} grew from step {finding.first_step}"
    for other in findings:
        remedy = other.remedy
        if other.metric == finding.metric and remedy and remedy.effective \
                and remedy.applied_step >= finding.detected_step:
            return (f"{head} ({finding.cause}) and stopped after {remedy.name}, applied at step "
                    f"{remedy.applied_step} for {other.cause}")
    return f"{head} and stopped by itself after step {finding.detected_step}: not a leak"


def series_summary(monitor: Monitor, name: str, settings: Settings) -> SeriesSummary:
    """One series over the run: start, end, peak, whole-run slope and trend (a growth too small to
    matter over the horizon is called flat)."""
    series = monitor.series[name]
    steps, values = series.history(since=settings.warmup)
    gap = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    points_per_window = max(1, round(settings.window / gap))  # windows are spans of steps
    trend = classify(steps, values, points_per_window, settings.alpha)
    slope = theil_sen(steps, values)[0] if len(values) >= 2 else 0.0
    end = series.end or 0.0
    kind = trend.kind
    if trend.growing and not is_material(series.spec.unit, trend.slope, end, settings.horizon, series.spec.limit):
        kind = "flat"
    start = series.start if series.start is not None else end
    return SeriesSummary(series.spec.unit, start, end, float(series.peak), slope, kind, series.points)


class Projection(NamedTuple):
    """Where one leak takes one metric it explains: `level` now, growing at `rate`, reaches `limit` at `step`."""

    finding: Finding
    metric: str
    rate: float
    level: float
    limit: float
    step: int


def projections(findings: list[Finding], monitor: Monitor, step: int, verifying: bool = True) -> list[Projection]:
    """Each leak without an effective remedy, projected onto every metric with a limit that it explains
    (a container's growth that explains resident memory is projected on resident memory, at that
    metric's own slope since the leak began). `verifying=False` leaves out leaks whose remedy is still
    being verified."""
    found = []
    for finding in findings:
        remedy = finding.remedy
        if finding.benign or (remedy and (remedy.effective or (remedy.effective is None and not verifying))):
            continue
        for metric in dict.fromkeys((finding.metric, *finding.explains)):
            series = monitor.series.get(metric)
            if series is None or not series.spec.limit:
                continue
            rate = finding.rate_per_step if metric == finding.metric else \
                theil_sen(*series.minima(0, finding.first_step))[0]
            level = series.end or 0.0
            left = steps_to_limit(level, rate, series.spec.limit)
            if left is not None:
                found.append(Projection(finding, metric, rate, level, series.spec.limit, step + int(left)))
    return found


def settings_record(settings: Settings, sample_stride: int) -> dict[str, Any]:
    return {"remedies": list(settings.remedies), "warmup": settings.warmup, "window": settings.window,
            "horizon": settings.horizon, "memory_limit": settings.memory_limit, "sample_stride": sample_stride,
            "on_limit": settings.on_limit if isinstance(settings.on_limit, str) else "callable",
            "limit_margin": settings.limit_margin}
