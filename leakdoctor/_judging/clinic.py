"""What the doctor does once a series is suspect: investigate, diagnose, treat, verify.

The per-step path (doctor.py) hands the clinic each sample's completed windows; the clinic opens an
investigation for suspect metrics (those that become suspect while it is open join it), concludes it
into findings, applies the first allowed remedy, keeps the active remedies acting on every step, and
judges each remedy by the slope after it. It times its own work (forensics and remedies), which the
doctor reports apart from the cost of sampling: in wall time, and in this thread's CPU time, which the
doctor takes off the steps' CPU time (under load an investigation's wall time can exceed it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from leakdoctor import remedies
from leakdoctor._base.evidence import Rule
from leakdoctor._base.messages import Record, msg, render
from leakdoctor._base.findings import Finding, RemedyOutcome
from leakdoctor._base.guard import Guard
from leakdoctor._base.integration import Cleanup, Forensic
from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.trend import SCALES, Trend, assess, is_material, steps_to_limit
from leakdoctor._base.units import format_value
from leakdoctor._judging.diagnosis import diagnose, unexplained_notes
from leakdoctor._judging.investigate import Investigation
from leakdoctor._judging.sites import allocation_sites
from leakdoctor._judging.stopped import stopped
from leakdoctor._judging.suspicion import Suspicion
from leakdoctor._judging.triage import Triage, corroborators
from leakdoctor._base.logs import Alert
from leakdoctor._reading.monitor import Monitor
from leakdoctor.remedies._base import Remedy, RemedyContext
from leakdoctor.settings import Settings


@dataclass
class Treatment:
    remedy: Remedy
    finding: Finding
    since: int  # verification reads the series from here: the remedy, or the end of a later investigation
    verified: bool = False
    undecided_at: int = 0  # windows read when a judgement was last put off (the slope's interval still
                           # reached an effective rate): judge again only once more have closed


@dataclass
class Practice:
    """What the integrations give the clinic to work with."""

    forensics: Sequence[Forensic]
    cleanups: Sequence[Cleanup]
    rules: Sequence[Rule]
    targets: Mapping[str, Any]
    read: Callable[[], Mapping[str, float]]  # fresh readings of every probe (the cleanup ladder's)
    #: fresh readings of the named counters only (a triage's), and the spec of any metric read
    read_for: Callable[[set[str]], Mapping[str, float]] = lambda names: {}
    spec: Callable[[str], MetricSpec] | None = None


class Clinic:
    def __init__(self, settings: Settings, monitor: Monitor, practice: Practice, guard: Guard,
                 say: Callable[[str], None]) -> None:
        self.settings = settings
        self.monitor = monitor
        self.suspicion = Suspicion(monitor)  # which metrics are suspect, on each window close
        self.practice = practice
        self.guard = guard
        self.say = say
        self.investigation: Investigation | None = None
        self.investigations = 0
        self.triage: Triage | None = None
        self._counters: set[str] = set()  # what the open triage reads
        self.triaged = 0  # suspicions checked on cheap counters before any investigation
        self.dismissed: dict[str, int] = {}  # metric: suspicions its counters did not confirm
        self.findings: list[Finding] = []
        self.treatments: list[Treatment] = []
        self.notes: list[Record] = []
        self.sites: list[dict[str, Any]] = []  # allocation sites the investigations saw grow (sites.py)
        self.forensic_seconds = 0.0
        self.remedy_seconds = 0.0
        #: The whole doctor's share of the run's time (`overhead`): an investigation waits while the doctor's
        #: total with it would pass that share; the first is always allowed, so a confirmed leak is named
        #: however short the run, and so is the first of each metric while nothing found still leaks.
        self.forensic_budget = settings.overhead
        self.spent_seconds = 0.0  # the doctor's time outside the clinic so far (its samples, its thread)
        self._timing = False
        self.deferred = 0  # suspicions left for later because investigations had used their budget
        self.deferred_at: list[dict[str, Any]] = []  # the first 20 of them: {step, metrics, why, seconds}
        # metric: its peak at its last investigation (inf while one is open), and the step that one ended,
        # see _due_again
        self._investigated: dict[str, float] = {}
        self._looked_at: dict[str, int] = {}
        self._tried: dict[tuple[str, str, str | None], set[str]] = {}
        self._step = 0
        self._context: Mapping[str, Any] = {}
        self._step_seconds = 0.0

    @property
    def idle(self) -> bool:
        """Nothing to do on unsampled steps: no remedy acting, no investigation or triage open."""
        return not self.treatments and self.investigation is None and self.triage is None

    @property
    def watching(self) -> bool:
        """Is every step to be sampled (an investigation or a triage is open)?"""
        return self.investigation is not None or self.triage is not None

    # --- called by the doctor -------------------------------------------------------------------

    def treat_step(self, step: int, context: Mapping[str, Any], step_seconds: float) -> None:
        """Let every active remedy act on this step."""
        self._step, self._context, self._step_seconds = step, context, step_seconds
        start = time.perf_counter()
        for treatment in list(self.treatments):
            part = f"remedy {treatment.remedy.name}"
            self.guard.call(part, treatment.remedy.on_step, self._context_for(treatment.finding))
            if part in self.guard.off:
                self.treatments.remove(treatment)
                outcome = treatment.finding.remedy
                if outcome is not None:
                    outcome.effective, outcome.error = False, self._error(part)
                self.monitor.quiet(treatment.finding.explains)
        self.remedy_seconds += time.perf_counter() - start

    def after_sample(self, step: int, completed: Mapping[str, list[int]], context: Mapping[str, Any],
                     step_seconds: float, run_seconds: float, spent_seconds: float = 0.0) -> None:
        """Move the pipeline on after a sample: the open investigation or triage, verification, new suspicion
        (investigated if the doctor's total, `spent_seconds` outside the clinic and the clinic's own, stays
        within its share of the run: `run_seconds` of the user's time so far and the doctor's)."""
        self._step, self._context, self._step_seconds = step, context, step_seconds
        self.spent_seconds = spent_seconds
        if self.investigation is not None:
            self._join(completed)
            self.timed(self.investigation.tick, step)
            if self.investigation.due(step):
                self.timed(self._conclude)
        self._verify()
        if self.triage is not None:
            self.timed(self._triage_step, step, completed, run_seconds)
        elif self.investigation is None and completed:
            suspects = {m: t for m, levels in completed.items() if (t := self.suspicion.of(m, levels))}
            if not suspects:
                return
            counters = corroborators(suspects, self._spec)
            if counters is None:
                self._escalate(suspects, run_seconds)
                return
            self.triaged += 1
            self.monitor.busy(suspects)
            self.triage, self._counters = Triage(dict(suspects), step, self.settings.window), counters
            self.timed(self._read_counters, step)

    def _escalate(self, suspects: Mapping[str, Trend], run_seconds: float) -> None:
        """Open an investigation of these suspects, unless investigations have used their budget."""
        if self._over_budget(suspects, run_seconds):
            self.deferred += 1
            if len(self.deferred_at) < 20:
                spent = self.spent_seconds + self.forensic_seconds
                self.deferred_at.append({"step": self._step, "metrics": sorted(suspects), "why": "budget",
                                         "spent_seconds": round(spent, 3), "run_seconds": round(run_seconds + spent, 3)})
            return
        self.timed(self._investigate, dict(suspects))

    def _spec(self, metric: str) -> MetricSpec:
        series = self.monitor.series.get(metric)
        if series is not None:
            return series.spec
        assert self.practice.spec is not None
        return self.practice.spec(metric)

    def _read_counters(self, step: int) -> None:
        """Read the triage's counters on its first step and then thrice a window (malloc's statistics walk
        every arena's free lists: milliseconds in a process of many threads)."""
        triage = self.triage
        assert triage is not None
        if (step - triage.start) % max(1, self.settings.window // 3) == 0:
            triage.add(step, self.practice.read_for(self._counters))

    def _triage_step(self, step: int, completed: Mapping[str, list[int]], run_seconds: float) -> None:
        """A step of the open triage: read its counters, let new suspects join, and at each window's end
        investigate what they confirmed, and cool what they did not (Triage.judge says when)."""
        triage = self.triage
        assert triage is not None
        self._read_counters(step)
        joining = {m: t for m, levels in completed.items()
                   if m not in triage.suspects and (t := self.suspicion.of(m, levels))}
        if joining:
            self.monitor.busy(joining)
            counters = corroborators(joining, self._spec)
            if counters is None:  # a metric that proves itself: investigate every suspect now
                triage.join(joining)
                self.triage = None
                self.monitor.free(triage.suspects)
                self._escalate(triage.suspects, run_seconds)
                return
            triage.join(joining)
            self._counters |= counters
        if not triage.due(step):
            return
        verdict = triage.judge(step, self._spec, self._level, self.settings.horizon)
        if verdict is None:
            return
        confirmed, dismissed = verdict
        self.triage = None
        for metric in dismissed:
            self.dismissed[metric] = self.dismissed.get(metric, 0) + 1
        self.monitor.cool(dismissed, step)
        if confirmed:
            self.monitor.free(confirmed)
            self._escalate(confirmed, run_seconds)

    def _level(self, metric: str) -> float:
        series = self.monitor.series.get(metric)
        if series is not None and series.end is not None:
            return float(series.end)
        readings = self.triage.readings.get(metric) if self.triage is not None else None
        return readings[-1][1] if readings else 0.0

    def conclude_pending(self, step: int) -> None:
        """At the end of the run: conclude an investigation that got far enough, verify what can be."""
        self._step = step
        self.triage = None
        if self.investigation is not None:
            if step - self.investigation.start_step >= self.investigation.length // 2:
                self._conclude()
            else:
                self.investigation.abort(step)
                self.investigation = None
        self._verify(minimum=2)

    def abandon(self, step: int) -> None:
        """Close an open window unjudged (the engine switched itself off): its tracer must not trace the
        rest of the run."""
        investigation, self.investigation, self.triage = self.investigation, None, None
        if investigation is not None:
            investigation.abort(step)

    def restore(self, findings: list[Finding], notes: list[Record]) -> None:
        """Go on from a resumed run's findings and notes."""
        self.findings, self.notes = findings, notes

    # --- investigate and diagnose -----------------------------------------------------------------

    def timed(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn`, its time the clinic's (once: a timed call within a timed call is not counted again)."""
        if self._timing:
            fn(*args)
            return
        self._timing, start = True, time.perf_counter()
        try:
            fn(*args)
        finally:
            self._timing = False
            self.forensic_seconds += time.perf_counter() - start

    def _over_budget(self, suspects: Mapping[str, Any], run_seconds: float) -> bool:
        """Must these suspects wait? When the doctor's total with one more investigation (as dear as the
        last ones) would pass its share of the run, yes, unless one of them would reach the memory limit
        before the budget allows a look, or nothing found so far still leaks and one of them is due a look
        (_due_again): a leak must not stay unnamed until the run has lasted twenty times the first
        investigation (a short run: its first investigation can cost a tenth of it), while a leak still
        growing is most likely what the other metric sees too."""
        if not self.investigations:
            return False
        spent = self.spent_seconds + self.forensic_seconds
        allowed = self.forensic_budget * (run_seconds + spent)
        need = spent + self.forensic_seconds / self.investigations - allowed
        if need <= 0 or self._before_budget(suspects, need):
            return False
        return self._leaking() or not any(self._due_again(metric) for metric in suspects)

    def _before_budget(self, suspects: Mapping[str, Trend], need: float) -> bool:
        """Would a suspect reach its memory limit before the budget earns the `need` seconds it lacks?"""
        if self._step_seconds <= 0 or self.forensic_budget <= 0:
            return False
        wait = need / (self.forensic_budget * self._step_seconds)
        for metric, trend in suspects.items():
            series = self.monitor.series.get(metric)
            if series is None or series.spec.limit is None or series.end is None:
                continue
            steps = steps_to_limit(float(series.end), trend.slope, series.spec.limit)
            if steps is not None and steps < wait:
                return True
        return False

    def _due_again(self, metric: str) -> bool:
        """Is a suspect due a look although investigations have used their share? Yes if it was never
        investigated, or its last window minimum has passed its peak at its last investigation: a growth
        that was no leak (resident memory warming up, an allocator's cache that malloc_trim took back)
        refills to that peak at most. Yes too if its last SCALES[2] window minima, all after that look,
        grow at a rate that matters: a refill fills what a step needs within a few steps, and a steady
        growth that the last look missed goes on (a Keras fit's warm-up that malloc_trim took back hid a
        leak's 136 KiB a batch; regrowing past the peak took 470 batches, past a 640-batch run once in 8)."""
        series = self.monitor.series[metric]
        if series.levels[0][-1][1] > self._investigated.get(metric, -math.inf):
            return True
        steps, minima = series.minima(0, self._looked_at.get(metric, 0))
        count = SCALES[2]
        if len(minima) < count:
            return False
        trend = assess(steps[-count:], minima[-count:], self.settings.alpha, scales=(count,), fit_flat=False)
        return trend.growing and is_material(series.spec.unit, trend.slope, series.end or 0.0,
                                             self.settings.horizon, series.spec.limit)

    def _leaking(self) -> bool:
        """Does a leak found so far still grow? A benign finding is none, nor one whose growth stopped
        (stopped.py: what the summary will note as no leak)."""
        return any(not f.benign and not stopped(f, self.monitor, self.settings) for f in self.findings)

    def _join(self, completed: Mapping[str, list[int]]) -> None:
        """Metrics that become suspect while an investigation is open join it. Each probe is read on a
        schedule of its own, so two series that grow together (compiles and the resident memory their
        executables take) close their windows on different samples: apart, the one investigated alone is
        misnamed (resident memory as native_memory) and the other waits for the investigation budget. The
        ladders read every metric, so a suspect that joins is judged on the whole window."""
        assert self.investigation is not None
        joining = {m: t for m, levels in completed.items()
                   if m not in self.investigation.suspects and (t := self.suspicion.of(m, levels))}
        if joining:
            self.monitor.busy(joining)
            self.investigation.join(joining)
            self._investigated.update(dict.fromkeys(joining, math.inf))

    def _investigate(self, suspects: dict[str, Any]) -> None:
        self.monitor.busy(suspects)
        self.investigations += 1
        self._investigated.update(dict.fromkeys(suspects, math.inf))
        ladder = [c for c in self.practice.cleanups if c.in_ladder]
        self.investigation = Investigation(suspects, self._step, self.settings.investigate_steps,
                                           self.practice.forensics, ladder, self.practice.read, self.guard)

    def _conclude(self) -> None:
        investigation, self.investigation = self.investigation, None
        assert investigation is not None
        for treatment in self.treatments:  # the ladders emptied what the remedies are judged on: judge anew
            if not treatment.verified:
                treatment.since = self._step
        specs: dict[str, MetricSpec] = {m: s.spec for m, s in self.monitor.series.items()}
        evidence = investigation.finish(self._step, self.monitor.trends(), specs, self.settings.remedies,
                                         self.settings.horizon)
        self._investigated.update({m: float(self.monitor.series[m].peak) for m in investigation.suspects})
        self._looked_at.update(dict.fromkeys(investigation.suspects, self._step))
        self.sites = allocation_sites(evidence.reports, self.sites, self._step)
        findings = diagnose(evidence, self.practice.rules, self.guard)
        self.notes += unexplained_notes(evidence, findings)
        explained: set[str] = set()
        for found in findings:
            finding = self._record(found)
            explained.update(finding.explains)
            treatment = self._treatment_of(finding)
            if treatment is not None and treatment.verified and finding.remedy and finding.remedy.effective:
                self.monitor.cool(finding.explains, self._step)  # found again within what its remedy leaves
                continue
            if treatment is not None:
                self.monitor.busy(finding.explains)  # found again while its remedy is judged: await the verdict
                continue
            if finding.key == found.key and self._treat(finding):  # a cache merged into another is treated there
                continue
            if finding.benign:
                self.monitor.cool(finding.explains, self._step)
            else:
                self.monitor.quiet(finding.explains)
        self.monitor.cool(set(investigation.suspects) - explained, self._step)

    def _record(self, found: Finding) -> Finding:
        """Add a new finding, or refresh the one with the same cause and place (it explains what both
        explain), or the benign cache that the same cleanup empties (MLX's buffer cache seen first in its
        own series, later in resident memory: one cache, named by what takes it back)."""
        for finding in self.findings:
            if finding.benign and found.benign and finding.cause == found.cause and \
                    found.reclaimed_by is not None and finding.reclaimed_by == found.reclaimed_by:
                finding.explains = tuple(dict.fromkeys([*finding.explains, *found.explains]))
                return finding
            if finding.key == found.key:
                if finding.remedy and finding.remedy.effective and self._still_works(finding):
                    return finding  # a remedy that acts every few steps leaves a pile that is found again
                if finding.remedy and finding.remedy.effective:
                    finding.remedy.effective = False
                    self.notes.append(msg("at_step", step=self._step, note=msg(
                        "came_back", cause=finding.cause, metric=finding.metric, remedy=finding.remedy.name)))
                finding.rate_per_step, finding.detected_step = found.rate_per_step, found.detected_step
                finding.detected_rate = found.detected_rate
                finding.evidence, finding.subject = found.evidence, found.subject
                finding.explains = tuple(dict.fromkeys([*finding.explains, *found.explains]))
                return finding
        self.findings.append(found)
        self.say(Alert(f"step {self._step}: suspected {'benign ' if found.benign else ''}{found.cause} on "
                       f"{found.metric} ({format_value(found.rate_per_step, found.unit)}/step)"
                       + (f" at {found.where}" if found.location else ""), "suspected", found, step=self._step))
        return found

    # --- treat and verify -------------------------------------------------------------------------

    def _context_for(self, finding: Finding) -> RemedyContext:
        return RemedyContext(finding, self.practice.targets, self._step, self._context, self._step_seconds,
                             self.practice.cleanups)

    def _treat(self, finding: Finding) -> bool:
        """Start the first allowed, applicable remedy not yet tried on this finding."""
        tried = self._tried.setdefault(finding.key, set())
        for name in self.settings.remedies:
            part = f"remedy {name}"
            remedy_class = None if name in tried else self.guard.call(part, remedies.load, name)
            if remedy_class is None or finding.cause not in remedy_class.treats:
                continue
            remedy = self.guard.call(part, remedy_class)
            ctx = self._context_for(finding)
            if remedy is None or not self.guard.call(part, remedy.applicable, ctx, default=False):
                continue
            tried.add(name)
            detail = self.guard.call(part, remedy.apply, ctx)
            if part in self.guard.off:
                finding.remedy = RemedyOutcome(name, self._step, effective=False, error=self._error(part))
                continue
            finding.remedy = RemedyOutcome(name, self._step, detail=detail or "")
            self.treatments.append(Treatment(remedy, finding, self._step))
            self.monitor.busy(finding.explains)
            self.say(Alert(f"step {self._step}: applied {name} for {finding.cause}" + (f": {render(detail)}" if detail else ""),
                           "remedy_applied", finding, step=self._step, remedy=name))
            return True
        return False

    def _verify(self, minimum: int | None = None) -> None:
        """Judge the remedies whose growth has been read long enough since; `minimum` (at the end of the
        run): judge with what there is, putting nothing off."""
        for treatment in list(self.treatments):
            windows = self.monitor.windows_since(treatment.finding.metric, treatment.since)
            if treatment.verified or windows < (minimum or self.settings.verify_windows) \
                    or windows <= treatment.undecided_at:
                continue
            self._judge(treatment, windows, final=minimum is not None)

    def _treatment_of(self, finding: Finding) -> Treatment | None:
        return next((t for t in self.treatments if t.finding is finding), None)

    def _still_works(self, finding: Finding) -> bool:
        """Does the growth since its remedy say that it still works (Remedy.held)?"""
        treatment = self._treatment_of(finding)
        return treatment is not None and treatment.verified and bool(self.guard.call(
            f"remedy {treatment.remedy.name}", treatment.remedy.held, finding.rate_per_step, self._after(treatment),
            default=False))

    def _after(self, treatment: Treatment) -> Trend:
        """The trend of the treated metric since the remedy; growth too small to be a leak reads flat."""
        metric = treatment.finding.metric
        after = self.monitor.trend_since(metric, treatment.since)
        series = self.monitor.series[metric]
        if after.growing and not is_material(series.spec.unit, after.slope, series.end or 0.0, self.settings.horizon,
                                             series.spec.limit):
            after = dataclasses.replace(after, kind="flat")
        return after

    def _judge(self, treatment: Treatment, windows: int, final: bool = False) -> None:
        finding, remedy = treatment.finding, treatment.remedy
        outcome = finding.remedy
        assert outcome is not None
        after = self._after(treatment)
        worked = self._worked(remedy, finding, after)
        if not worked and not final and windows < 2 * self.settings.verify_windows and \
                self._worked(remedy, finding, dataclasses.replace(after, kind="flat", slope=after.slope_low)):
            # the low end of the slope's interval says it worked: a jump among a few readings (a compile,
            # a buffer) can lift the estimate over the line; read more before undoing the remedy
            treatment.undecided_at = windows
            return
        counted = finding.unit != "count" or remedy.stops_count
        outcome.effective, outcome.rate_after = worked, after.slope if counted else None
        treatment.verified = True
        after_text = f"{format_value(outcome.rate_after, finding.unit)}/step after" if counted else \
            "the count goes on, what it holds is freed"
        self.say(Alert(f"step {self._step}: {remedy.name} {'worked' if worked else 'did NOT work'} on "
                       f"{finding.cause} ({format_value(finding.rate_per_step, finding.unit)}/step before, {after_text})",
                       "remedy_worked" if worked else "remedy_failed", finding, step=self._step, remedy=remedy.name,
                       state="remedied" if worked else "suspected"))
        if worked:
            self.monitor.watch(finding.explains, since=self._step)
            return
        self.treatments.remove(treatment)
        if self.guard.call(f"remedy {remedy.name}", remedy.undo, self._context_for(finding), default=False):
            outcome.detail = [outcome.detail, msg("undone")] if outcome.detail else msg("undone")
        self.notes.append(msg("at_step", step=self._step, note=msg(
            "did_not_stop", remedy=remedy.name, cause=finding.cause, metric=finding.metric)))
        if self._treat(finding):
            return
        if finding.benign:  # what goes on growing may not be the cache it was taken for: look again later
            self.monitor.cool(finding.explains, self._step)
        else:
            self.monitor.quiet(finding.explains)

    def _worked(self, remedy: Remedy, finding: Finding, after: Trend) -> bool:
        return bool(self.guard.call(f"remedy {remedy.name}", remedy.worked, finding.rate_per_step, after,
                                    default=False))

    def _error(self, part: str) -> str:
        return next((e["error"] for e in reversed(self.guard.errors) if e["part"] == part), "failed")
