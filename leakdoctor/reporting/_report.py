"""The end-of-run summary, built from what the monitor and the clinic hold. Pure functions: they read
the run's state and return new objects, so a snapshot in the middle of a run changes nothing."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from leakdoctor._base.findings import Finding, SeriesSummary
from leakdoctor._base.messages import Record, msg
from leakdoctor._base.trend import SCALES, classify, is_material, steps_to_limit, theil_sen
from leakdoctor._base.units import format_value
from leakdoctor._judging.stopped import FIT_POINTS, stopped, thinned, whole_fit
from leakdoctor._reading.monitor import RISING, Monitor
from leakdoctor.settings import Settings

if TYPE_CHECKING:
    from leakdoctor._judging.clinic import Clinic
    from leakdoctor._reading.sampling import Sampler


RESIDENT = "rss_bytes"
#: Causes whose evidence shows the mechanism itself (a graph kept alive, a hook added, a function traced
#: again, a lazy graph chained across steps): a finding of one is reported whatever its rate, as minor
#: where the rate does not matter over the horizon. Growth named only by its rate (python_objects,
#: native_memory, ...) is withdrawn instead when it does not matter.
PROVEN_CAUSES = frozenset({"lazy_graph", "compile_cache", "hook_accumulation", "retained_graph"})


def proven(finding: Finding) -> bool:
    """Does the evidence prove the cause, whatever its rate? The causes above, arrays or a container kept
    by a named holder (its place is known), and objects that a rule saw still referenced after a full
    collection (its subject's `referenced`: Keras models that the program keeps)."""
    return finding.cause in PROVEN_CAUSES or (
        finding.cause in ("device_arrays", "container_growth") and finding.location is not None) or \
        getattr(finding.subject, "referenced", False) is True


def final_findings(findings: list[Finding], monitor: Monitor, settings: Settings) -> list[Finding]:
    """Copies of the findings, each with its final `state` and `severity` and its rate refit over the
    whole run, so the verdict does not depend on when the run looked. Nothing found is dropped: a
    growth that stopped by itself, or that is too small to matter and is not a proven cause, is
    `withdrawn` with its reason; a proven cause too slow to matter is `minor`. With an effective remedy,
    the rate after it is refit over everything read since it was applied. One cause at one place seen on
    several metrics is one finding (merged), judged on each of them (_compile_counts)."""
    judged = [_judged(finding, findings, monitor, settings) for finding in findings]
    judged += [_judged(count, findings, monitor, settings) for count in _compile_counts(findings, monitor, settings)]
    return merged(judged)


def _compile_counts(findings: list[Finding], monitor: Monitor, settings: Settings) -> list[Finding]:
    """For a compile_cache finding on memory that also explains a compile count (the investigation that
    named it read both; the count then goes unwatched), the same finding on that count, where no finding
    is on it yet, no remedy stopped the memory's growth, and the count went on growing over the run.
    The summary judges the compiles as it would have had their count been investigated first: memory's
    whole-run refit can call the executables too small to matter while a compile a step goes on, and the
    verdict must not depend on which series raised the suspicion first (a run of the textbook
    flax_jit_lambda scenario was `clean` with a minor finding on memory for that). The stronger of the
    two stays (merged); a remedied finding is left as it is (clear_cache bounded what it leaked)."""
    have = {finding.key for finding in findings}
    found = []
    for finding in findings:
        if finding.cause != "compile_cache" or finding.benign or (finding.remedy and finding.remedy.effective):
            continue
        for metric in finding.explains:
            series = monitor.series.get(metric)
            if metric == finding.metric or series is None or series.spec.unit != "count" or \
                    (finding.cause, metric, finding.where) in have:
                continue
            fit = whole_fit(series, settings, since=finding.first_step - 1)
            if fit is None or fit[0] <= 0:
                continue
            found.append(dataclasses.replace(
                finding, metric=metric, unit="count", rate_per_step=fit[0], rate_interval=fit[1:],
                detected_rate=fit[0], remedy=None, explains=(metric,), supporting=[]))
    return found


#: The order of strength of a judged finding's state: a leak before a remedied one (a leak that goes on
#: is what the verdict must say), then what is listed only.
STRENGTH = {"leak": 0, "remedied": 1, "minor": 2, "benign": 3, "withdrawn": 4}


def merged(findings: list[Finding]) -> list[Finding]:
    """One finding per cause and place. The clinic keeps a finding per metric (a remedy is judged on the
    metric it acts on: clear_cache bounds the memory that compiles take while the compile count goes on),
    so one cause at one place can be found twice (JAX compiles, and the resident memory their executables
    take, found by two investigations). The strongest of them stays (_strength), in the place of the first,
    and each other one becomes its `supporting` evidence (projected onto a limit at its own rate while it
    leaks: projections). The verdict is unchanged: a major leak of a group leads it. Findings without a
    place are never merged: nothing shows that they share a cause."""
    groups: dict[tuple[str, str] | int, list[Finding]] = {}
    for finding in findings:
        key = (finding.cause, finding.where) if finding.location else id(finding)
        groups.setdefault(key, []).append(finding)
    return [_merge(group) if len(group) > 1 else group[0] for group in groups.values()]


def _strength(finding: Finding) -> tuple[bool, int, int]:
    """Sort key, strongest first: one that makes the verdict (a major leak or remedy), then by state, then
    the first found (the evidence the live alert announced first)."""
    return not finding.counts, STRENGTH.get(finding.final_state, len(STRENGTH)), finding.detected_step


def _merge(group: list[Finding]) -> Finding:
    """The strongest finding of one cause at one place, with the others as its supporting evidence."""
    lead, *others = sorted(group, key=_strength)
    lead.supporting = [*lead.supporting, *(_supporting(other) for other in others)]
    return lead


def _supporting(finding: Finding) -> dict[str, Any]:
    """What a finding merged into another showed: its metric, rate, steps, state, severity and remedy."""
    return {"metric": finding.metric, "rate_per_step": finding.rate_per_step, "unit": finding.unit,
            "first_step": finding.first_step, "detected_step": finding.detected_step,
            "state": finding.final_state, "severity": finding.severity, "reason": finding.reason,
            "remedy": dataclasses.asdict(finding.remedy) if finding.remedy else None}


def _judged(finding: Finding, findings: list[Finding], monitor: Monitor, settings: Settings) -> Finding:
    copy = dataclasses.replace(finding, remedy=dataclasses.replace(finding.remedy) if finding.remedy else None)
    series = monitor.series.get(finding.metric)
    remedy = copy.remedy
    grew = True
    if series is not None and remedy and remedy.effective:
        after = whole_fit(series, settings, since=remedy.applied_step) \
            if remedy.rate_after is not None or finding.unit != "count" else None  # none: the count goes on
        remedy.rate_after = after[0] if after else remedy.rate_after
    elif series is not None:
        fit = whole_fit(series, settings, since=finding.first_step - 1,
                        until=remedy.applied_step if remedy else None)
        if fit and fit[0] > 0:
            share = rate_share(finding, findings)
            copy.rate_per_step, copy.rate_interval = fit[0] * share, (fit[1] * share, fit[2] * share)
            if series.spec.lower_bound and finding.rate_per_step > copy.rate_per_step:  # the window counted exactly
                copy.rate_per_step, copy.rate_interval = finding.rate_per_step, None
        grew = fit is None or fit[0] > 0  # shrank over the run: the rate at detection stays, none of it matters
    material = grew and (series is None or _material(copy, series, settings))
    copy.state, copy.reason = _state(copy, finding, findings, monitor, settings, material, grew)
    copy.severity = {"benign": None, "withdrawn": None, "minor": "minor"}.get(
        copy.state, "major" if material else "minor")
    return copy


def rate_share(finding: Finding, findings: list[Finding]) -> float:
    """The part of its metric's whole-run rate that is the finding's own: where leaks found together share a
    metric (_judging/diagnosis.py shared_rates), in proportion of the rates each had when found; else all."""
    together = [f.detected_rate or 0.0 for f in findings if f.metric == finding.metric and not f.benign
                and f.detected_step == finding.detected_step]
    total = sum(together)
    return (finding.detected_rate or 0.0) / total if len(together) > 1 and total > 0 else 1.0


def _state(copy: Finding, finding: Finding, findings: list[Finding], monitor: Monitor, settings: Settings,
           material: bool, grew: bool) -> tuple[str, Record | None]:
    """The finding's final state, and the reason where it is withdrawn."""
    if copy.benign:
        return "benign", None
    if copy.remedy and copy.remedy.effective:
        return "remedied", None
    if not material:  # too slow for resident memory to show whether it stopped: the proof decides
        why = msg("slow_over_run", metric=finding.metric, rate=copy.rate_per_step, unit=finding.unit,
                  horizon=settings.horizon) if grew else msg("flat_since_found", metric=finding.metric)
        return ("minor", None) if proven(copy) else ("withdrawn", why)
    # Resident memory reuses the heap it freed, so it can level off while a proven cause goes on (a list
    # of outputs that keep their graphs): only an exact counter (live arrays, a count) shows such a stop.
    resident_proof = proven(copy) and finding.metric == RESIDENT
    if copy.remedy is None and not resident_proof and finding.metric in monitor.series \
            and stopped(finding, monitor, settings):
        return "withdrawn", stopped_note(finding, findings)
    return "leak", None


def _material(finding: Finding, series: Any, settings: Settings) -> bool:
    """Could the finding's whole-run rate matter over the horizon? Judged on the upper end of the rate's
    confidence interval, so only a growth that is immaterial with confidence (a long, tight history) is
    dropped; a short, noisy history keeps its finding. Counts are judged by what they hold when the
    diagnosis was made (container_growth checks bytes and step time), so only bytes and seconds are
    judged again here."""
    if finding.unit == "count":
        return True
    high = finding.rate_interval[1] if finding.rate_interval else finding.rate_per_step
    return is_material(finding.unit, max(high, finding.rate_per_step), series.end or 0.0, settings.horizon,
                       series.spec.limit)


def skipped_notes(monitor: Monitor) -> list[Record]:
    """One note per metric that read NaN or inf: those readings were left out of its series."""
    return [msg("nan_readings", metric=metric, count=count, step=first) for metric, (first, count) in monitor.skipped.items()]


def stopped_note(finding: Finding, findings: list[Finding]) -> Record:
    """Why a growth that stopped is no leak: a remedy applied for another finding on the same metric
    stopped it, or it stopped by itself."""
    for other in findings:
        remedy = other.remedy
        if other.metric == finding.metric and remedy and remedy.effective \
                and remedy.applied_step >= finding.detected_step:
            return msg("stopped_after_remedy", metric=finding.metric, first_step=finding.first_step,
                       cause=finding.cause, remedy=remedy.name, applied_step=remedy.applied_step, other=other.cause)
    return msg("stopped_by_itself", metric=finding.metric, first_step=finding.first_step,
               detected_step=finding.detected_step)


def unwatched(settings: Settings, steps: int, engine_error: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Why the run cannot be called clean, and what to do: when the doctor's engine failed and switched
    itself off (`engine_error`, the guard's record: nothing after it was watched), or when the run had too
    few steps after warm-up for a fast leak to be found (latency_steps at a sample every step: the
    detector's shortest test and an investigation); None when it was watched long enough."""
    if engine_error is not None:
        return {"reason": f"the doctor failed and switched itself off ({engine_error['part']}: "
                          f"{engine_error['error']}): the run was not watched from then on",
                "fix": "a bug in leakdoctor, not in the run: please report it with this summary's `errors`"}
    needed = settings.warmup + latency_steps(settings, 1)
    if steps >= needed:
        return None
    return {"reason": f"{steps} step(s) seen; a verdict needs {needed}: the warm-up of {settings.warmup} steps "
                      f"and {needed - settings.warmup} to find a leak that starts then",
            "fix": "train for more steps, or lower warmup= and window=; if the script trains for longer than "
                   "this, its step was not recognised: name it with `leakdoctor run --step-on module:function`"}


def series_summary(monitor: Monitor, name: str, settings: Settings) -> SeriesSummary:
    """One series over the run: start, end, peak, whole-run slope and trend (a growth too small to
    matter over the horizon is still `growing`, marked `slow`: a series that grew steadily is never
    called flat)."""
    series = monitor.series[name]
    steps, values = series.history(since=settings.warmup)
    gap = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    # windows are spans of steps, and at most FIT_POINTS of them are tested
    points_per_window = max(1, round(settings.window / gap), math.ceil(len(values) / FIT_POINTS))
    trend = classify(steps, values, points_per_window, settings.alpha)
    slope = theil_sen(*thinned(steps, values))[0] if len(values) >= 2 else 0.0
    end = series.end or 0.0
    slow = trend.growing and not is_material(series.spec.unit, trend.slope, end, settings.horizon, series.spec.limit)
    start = series.start if series.start is not None else end
    return SeriesSummary(series.spec.unit, start, end, float(series.peak), slope, trend.kind, series.points, slow)


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
    metric's own slope since the leak began), and onto those its supporting evidence still leaks on, at
    their own rates; a leak that shares its metric with others found with it, at the metric's whole rate
    (rate_share). `verifying=False` leaves out leaks whose remedy is still being verified. A metric that
    another series covers (resident memory, under a cgroup limit that counts the cgroup's charge) is
    projected onto that series instead, at its own slope since the leak began: the figure the limit is
    compared with."""
    found = []
    covering = {s.spec.covers: m for m, s in monitor.series.items() if s.spec.covers and s.spec.limit}
    for finding in findings:
        remedy = finding.remedy
        if finding.final_state != "leak" or (remedy and remedy.effective is None and not verifying):
            continue  # benign, remedied, minor or withdrawn: nothing to project
        rates = {other["metric"]: other["rate_per_step"] for other in finding.supporting
                 if other.get("state") == "leak" and other.get("rate_per_step") is not None}
        share = rate_share(finding, findings)  # the metric grows by every leak found in it: its whole rate
        rates[finding.metric] = finding.rate_per_step / share if share > 0 else finding.rate_per_step
        for metric in dict.fromkeys(covering.get(m, m) for m in (finding.metric, *finding.explains, *rates)):
            series = monitor.series.get(metric)
            if series is None or not series.spec.limit:
                continue
            rate = rates[metric] if metric in rates else theil_sen(*series.minima(0, finding.first_step))[0]
            level = series.end or 0.0
            left = steps_to_limit(level, rate, series.spec.limit)
            if left is not None:
                found.append(Projection(finding, metric, rate, level, series.spec.limit, step + int(left)))
    return found


def projection(findings: list[Finding], monitor: Monitor, step: int) -> int | None:
    """The first step at which an unremedied leak is projected to reach a limit."""
    return min((p.step for p in projections(findings, monitor, step)), default=None)


def settings_record(settings: Settings, sample_stride: int) -> dict[str, Any]:
    return {"remedies": list(settings.remedies), "warmup": settings.warmup, "window": settings.window,
            "horizon": settings.horizon, "investigate_steps": settings.investigate_steps,
            "memory_limit": settings.memory_limit, "sample_stride": sample_stride,
            "on_limit": settings.on_limit if isinstance(settings.on_limit, str) else "callable",
            "limit_margin": settings.limit_margin, "heartbeat": settings.heartbeat,
            "oom_watermark": settings.oom_watermark}


def overhead(sampler: Sampler, clinic: Clinic, settings: Settings) -> dict[str, Any]:
    """The doctor's monitoring time against the whole step: the user's code plus the remedies, whose
    time is the step's work done for it (force_eval evaluates what the step left lazy). And the honest
    total: step()'s own time, the sampler thread's CPU time and the investigations', against the run's
    wall time from the first step (the user's code, the remedies and the doctor's time on the training
    thread together); `sampling` says where resident memory's rise was watched ("thread" or "inline")."""
    step_time = sampler.user_seconds + clinic.remedy_seconds
    thread = sampler.thread_seconds
    total = sampler.own_seconds + clinic.forensic_seconds + thread
    run_time = step_time + sampler.own_seconds + clinic.forensic_seconds
    stride = sampler.pacer.every
    return {
        "total_seconds": total,
        "run_seconds": run_time,
        "fraction_of_run_time": total / run_time if run_time else 0.0,
        "probe_seconds": sampler.own_seconds,
        "thread_cpu_seconds": thread,
        "forensic_seconds": clinic.forensic_seconds,
        "remedy_seconds": clinic.remedy_seconds,
        "step_seconds": sampler.user_seconds,
        "fraction_of_step_time": sampler.own_seconds / step_time if step_time else 0.0,
        "investigations": clinic.investigations,
        "investigations_deferred": clinic.deferred,
        **({"deferred": list(clinic.deferred_at)} if clinic.deferred_at else {}),
        "suspicions_triaged": clinic.triaged,
        **({"suspicions_dismissed": dict(clinic.dismissed)} if clinic.dismissed else {}),
        "forensic_budget": clinic.forensic_budget,
        "sample_stride": stride,
        "latency_steps": latency_steps(settings, stride),
        "sampling": sampler.mode,
        **({"sampling_why": sampler.inline_why} if sampler.mode == "inline" and sampler.inline_why else {}),
    }


def latency_steps(settings: Settings, stride: int) -> int:
    """Steps a fast leak needs to be found when every `stride`-th step is sampled: RISING window minima
    at the stride (a window spans at least one sample), then the rest of the shortest scale's windows
    sampled twice a window (the doctor hurries once a metric rises), one more for the last to close,
    and an investigation."""
    window = settings.window
    return max(window, stride) * RISING + window * (SCALES[0] - RISING + 1) + settings.investigate_steps
