"""The engine: owns the probes, the monitor, investigations, findings and remedies.

Each `step()` does the cheap part (active remedies, due probes, window bookkeeping) in microseconds.
The expensive part, an investigation, runs only when a metric is suspect, for a bounded window. Data
flows one way: probes → series → detector → investigation → diagnosis → remedy → verification → summary.
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
import time
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from leakdoctor import __version__, remedies
from leakdoctor.detect import classify, is_material, steps_to_limit, theil_sen
from leakdoctor.diagnosis import GENERIC_RULES, diagnose, unexplained_notes
from leakdoctor.guard import Guard
from leakdoctor.integrations import UNITS, Integration, MetricSpec, Probe, process, python
from leakdoctor.investigate import Investigation
from leakdoctor.monitor import Monitor
from leakdoctor.pacing import Pacer
from leakdoctor.remedies.base import Remedy, RemedyContext
from leakdoctor.settings import Settings
from leakdoctor.summary import Finding, RemedyOutcome, SeriesSummary, Summary, format_value

STEP_TIME = "step_seconds"
STEP_CPU = "step_cpu_seconds"
STATE_SCHEMA = "leakdoctor.state/1"


class _Scheduled:
    """A probe read on every `probe.every`-th sample."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self._countdown = 0

    def due(self) -> bool:
        self._countdown -= 1
        if self._countdown > 0:
            return False
        self._countdown = max(1, self.probe.every)
        return True


@dataclass
class _Treatment:
    remedy: Remedy
    finding: Finding
    since: int
    verified: bool = False


class LeakDoctor:
    """Watches memory while a model trains, tells a leak from normal growth, names its cause, applies a
    remedy when allowed and checks that it worked. Call `step()` at the end of every training step and
    `finish()` at the end (or use it as a context manager); `summary` holds the result.

    remedies: "off" (detect and recommend), "safe" (semantics-preserving remedies), "all", or a list of
    remedy names. warmup: steps ignored at the start. window: steps per detection window (a leak is
    suspected after 6 windows of growth). horizon: steps over which a growth must matter. memory_limit: bytes or "8GiB" (default: RAM or cgroup limit).
    """

    framework: ClassVar[str] = "python"

    def __init__(
        self,
        *,
        remedies: str | Sequence[str] = "off",
        summary_path: Any = None,
        plot_path: Any = None,
        warmup: int = 20,
        window: int = 6,
        horizon: int = 100_000,
        memory_limit: int | float | str | None = None,
        alpha: float = 0.01,
        investigate_steps: int | None = None,
        verify_windows: int = 8,
        overhead: float = 0.005,
        verbose: bool = True,
        rank: int = 0,
        integrations: Sequence[Integration] = (),
    ) -> None:
        self.settings = Settings.create(
            remedies=remedies, warmup=warmup, window=window, horizon=horizon, memory_limit=memory_limit,
            alpha=alpha, investigate_steps=investigate_steps, verify_windows=verify_windows, overhead=overhead,
            summary_path=summary_path, plot_path=plot_path, verbose=verbose, rank=rank)
        self._guard = Guard()
        self._watchlist = python.Watchlist(self._guard)
        parts = [process.integration(self.settings.memory_limit, self.settings.overhead),
                 python.integration(self._watchlist), *integrations]
        self._probes = [_Scheduled(p) for part in parts for p in part.probes]
        self._forensics = [f for part in parts for f in part.forensics]
        self._cleanups = [c for part in parts for c in part.cleanups]
        self._rules = [r for part in parts for r in part.rules] + GENERIC_RULES
        self.targets: dict[str, Any] = {k: v for part in parts for k, v in part.targets.items()}
        self._monitor = Monitor(self.settings)
        self._specs = {name: MetricSpec(name, "seconds", role="supporting", source="process")
                       for name in (STEP_TIME, STEP_CPU)}
        self._investigation: Investigation | None = None
        self._investigations = 0
        self._findings: list[Finding] = []
        self._treatments: list[_Treatment] = []
        self._tried: dict[tuple[str, str, str | None], set[str]] = {}
        self._notes: list[str] = []
        self._step = 0
        self._context: Mapping[str, Any] = {}
        self._sampler = Pacer(budget=self.settings.overhead, maximum=256)  # sampled steps run cold: ~100 µs
        self._countdown = 1
        self._idle = True
        self._sampled_step = 0
        self._busy_since_sample = 0.0
        self._step_ema = 0.0
        self._user_seconds = 0.0
        self._probe_seconds = 0.0
        self._forensic_seconds = 0.0
        self._remedy_seconds = 0.0
        self._sample_end = time.perf_counter()
        self._cpu_mark = time.process_time()
        self._result: Summary | None = None
        self._atexit = partial(_finish_at_exit, weakref.ref(self))
        atexit.register(self._atexit)

    # --- what users call -------------------------------------------------------------------------

    def watch(self, name: str, gauge: Callable[[], float], unit: str = "count") -> None:
        """Track a user gauge every step, e.g. `doctor.watch("nodes", lambda: len(graph.nodes))`."""
        if not isinstance(name, str) or not name or name in self._specs or self._watchlist.has(name):
            raise ValueError(f"watch: name {name!r} must be a new, non-empty string")
        if not callable(gauge):
            raise ValueError(f"watch({name!r}): gauge must be a callable returning a number, got {gauge!r}")
        if unit not in UNITS:
            raise ValueError(f"watch({name!r}): unit {unit!r}, expected one of {UNITS}")
        self._watchlist.add_gauge(name, gauge, unit)

    def watch_object(self, obj: Any, name: str | None = None, include_private: bool = False) -> None:
        """Count the items of `obj`'s list/dict/set/tuple/deque attributes (or of `obj` itself if it is
        one) every step, so a container that keeps growing is named. Private attributes only if asked."""
        if obj is None:
            raise ValueError("watch_object: obj is None")
        label = name or type(obj).__name__
        if not isinstance(label, str) or not label:
            raise ValueError(f"watch_object: name {name!r} must be a non-empty string")
        self._watchlist.add_object(obj, label, include_private)

    def step(self, **context: Any) -> None:
        """Call once at the end of every training step. Keyword arguments (this step's arrays, loss,
        state) are handed to remedies that need them, e.g. force_eval evaluates them."""
        self._countdown -= 1
        if self._countdown > 0 and self._idle:
            self._step += 1
            return
        self._work(context)

    def _work(self, context: Mapping[str, Any]) -> None:
        """The part of a step that does something: remedies, and a sample when one is due."""
        start = time.perf_counter()
        if self._result is not None or "leakdoctor" in self._guard.off:
            self._idle = False
            return
        self._step += 1
        self._context = context
        elsewhere = self._forensic_seconds + self._remedy_seconds
        sampled = self._investigation is not None or self._countdown <= 0
        try:
            if self._treatments:
                self._timed_remedies()
            if sampled:
                self._sample(start)
        except Exception as err:  # noqa: BLE001 - a bug in leakdoctor must not end the user's run
            self._guard.disable("leakdoctor", f"{type(err).__name__}: {err}")
        end = time.perf_counter()
        self._probe_seconds += (end - start) - (self._forensic_seconds + self._remedy_seconds - elsewhere)
        if sampled:
            self._sample_end, self._busy_since_sample, self._cpu_mark = end, 0.0, time.process_time()
        else:
            self._busy_since_sample += end - start
        self._idle = not self._treatments and self._investigation is None

    def finish(self, exception: BaseException | None = None) -> Summary:
        """End the run: conclude what is pending, build the summary, write, plot and print it. Safe to
        call more than once; later calls return the same summary."""
        if self._result is not None:
            return self._result
        atexit.unregister(self._atexit)
        if exception is not None:
            self._notes.append(f"the run ended with {type(exception).__name__} at step {self._step}")
        self._account_user_time(time.perf_counter())
        self._idle = False
        self._guard.call("finish", self._conclude_pending)
        summary = self._guard.call("summary", self._build_summary) or self._bare_summary()
        summary = self._guard.call("complete summary", self._complete, summary, exception) or summary
        self._result = summary
        self._emit(summary)
        return summary

    def _complete(self, summary: Summary, exception: BaseException | None) -> Summary:
        """The summary to write and print; a subclass adds what this process alone does not know (the
        other ranks' findings of a distributed run)."""
        return summary

    @property
    def summary(self) -> Summary:
        """The final summary after `finish()`, else a snapshot of the run so far."""
        if self._result is not None:
            return self._result
        return self._guard.call("summary", self._build_summary) or self._bare_summary()

    @property
    def steps(self) -> int:
        return self._step

    @property
    def readings(self) -> dict[str, float]:
        """The latest value of every series, e.g. for a framework logger."""
        return {name: s.end for name, s in self._monitor.series.items() if s.end is not None}

    @property
    def active_remedies(self) -> list[Remedy]:
        """Remedies currently applied (being verified, or verified effective)."""
        return [t.remedy for t in self._treatments]

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on from this one (for checkpoints): the step count, findings and
        notes. The series stay with this process."""
        return {"schema": STATE_SCHEMA, "steps": self._step, "findings": [f.to_dict() for f in self._findings],
                "notes": list(self._notes)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from a `state_dict()`; call it before the first step. Steps count on from the saved ones,
        and a new warm-up follows them, since this process's memory starts afresh."""
        if self._step:
            raise RuntimeError(f"load_state_dict: call it before the first step (this doctor is at step {self._step})")
        if not isinstance(state, Mapping) or state.get("schema") != STATE_SCHEMA:
            raise ValueError(f"load_state_dict: expected a dict from LeakDoctor.state_dict() (schema {STATE_SCHEMA!r})")
        self._step = self._sampled_step = int(state["steps"])
        self._findings = [Finding.from_dict(f) for f in state["findings"]]
        self._notes = list(state["notes"])
        self.settings = dataclasses.replace(self.settings, warmup=self.settings.warmup + self._step)
        self._monitor.settings = self.settings

    def __enter__(self) -> "LeakDoctor":
        self._sample_end, self._cpu_mark = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.finish(exc)
        return False

    # --- one step ------------------------------------------------------------------------------

    def _sample(self, start: float) -> None:
        """Read the due probes, record, and move the pipeline on (investigate, diagnose, verify)."""
        begin = time.perf_counter()  # the sample's cost leaves out the remedies that ran before it
        investigating = self._investigation is not None
        wall, cpu = self._account_user_time(start)
        forensic_before = self._forensic_seconds
        readings = self._read(due_only=True)
        if self._investigation is None:
            readings[STEP_TIME], readings[STEP_CPU] = wall, cpu
            self._step_ema = wall if not self._step_ema else 0.9 * self._step_ema + 0.1 * wall
        completed = self._monitor.record(self._step, readings, self._specs.__getitem__)
        if self._investigation is not None:
            self._timed(self._investigation.tick, self._step)
            if self._investigation.due(self._step):
                self._timed(self._conclude)
        self._verify()
        if self._investigation is None:
            suspects = {m: t for m, levels in completed.items() if (t := self._monitor.suspicion(m, levels))}
            if suspects:
                self._timed(self._investigate, suspects)
        if not investigating:  # an investigation samples every step, and tracing makes those samples dear
            cost = time.perf_counter() - begin - (self._forensic_seconds - forensic_before)
            self._countdown = self._sampler.update(cost, self._step_ema)

    def _account_user_time(self, now: float) -> tuple[float, float]:
        """Add the user's time since the last sample to the total; return it per step, as wall time and
        as this process's CPU time (which other processes on a busy machine do not inflate)."""
        steps = max(1, self._step - self._sampled_step)
        user = max(0.0, now - self._sample_end - self._busy_since_sample)
        cpu = max(0.0, time.process_time() - self._cpu_mark - self._busy_since_sample)
        self._user_seconds += user
        self._sampled_step = self._step
        return user / steps, cpu / steps

    def _read(self, due_only: bool = False) -> dict[str, float]:
        """Readings of every (due) probe; all of them fresh when not `due_only` (the cleanup ladder reads
        `read_now` where a probe throttles itself). A probe that raises is switched off, once."""
        readings: dict[str, float] = {}
        failed = []
        for scheduled in self._probes:
            if due_only and not scheduled.due():
                continue
            probe = scheduled.probe
            try:
                read = probe.read if due_only else getattr(probe, "read_now", probe.read)
                for metric, value in read().items():
                    if metric not in self._specs:
                        self._specs[metric] = probe.spec(metric)
                    readings[metric] = value
            except Exception as err:  # noqa: BLE001 - a failing probe must not end the user's run
                failed.append((scheduled, err))
        for scheduled, err in failed:
            self._probes.remove(scheduled)
            self._guard.disable(f"probe {scheduled.probe.name}", f"{type(err).__name__}: {err}")
        return readings

    def _timed(self, fn: Callable[..., None], *args: Any) -> None:
        start = time.perf_counter()
        fn(*args)
        self._forensic_seconds += time.perf_counter() - start

    # --- investigate, diagnose, treat ------------------------------------------------------------

    def _investigate(self, suspects: dict[str, Any]) -> None:
        self._monitor.busy(suspects)
        self._investigations += 1
        ladder = [c for c in self._cleanups if c.in_ladder]
        self._investigation = Investigation(suspects, self._step, self.settings.investigate_steps,
                                            self._forensics, ladder, self._read, self._guard)

    def _conclude(self) -> None:
        investigation, self._investigation = self._investigation, None
        assert investigation is not None
        evidence = investigation.finish(self._step, self._monitor.trends(), self._specs, self.settings.remedies)
        findings = diagnose(evidence, self._rules, self._guard)
        self._notes += unexplained_notes(evidence, findings)
        explained: set[str] = set()
        for found in findings:
            finding = self._record(found)
            explained.update(finding.explains)
            if self._treat(finding):
                continue
            if finding.benign:
                self._monitor.cool(finding.explains, self._step)
            else:
                self._monitor.quiet(finding.explains)
        self._monitor.cool(set(investigation.suspects) - explained, self._step)

    def _record(self, found: Finding) -> Finding:
        """Add a new finding, or refresh the one with the same cause and place."""
        for finding in self._findings:
            if finding.key == found.key:
                if finding.remedy and finding.remedy.effective:
                    finding.remedy.effective = False
                    self._notes.append(f"step {self._step}: {finding.cause} on {finding.metric} came back "
                                       f"after {finding.remedy.name}")
                finding.rate_per_step, finding.detected_step = found.rate_per_step, found.detected_step
                finding.evidence, finding.subject = found.evidence, found.subject
                return finding
        self._findings.append(found)
        self._say(f"step {self._step}: {'benign ' if found.benign else ''}{found.cause} on {found.metric} "
                  f"({format_value(found.rate_per_step, found.unit)}/step)"
                  + (f" at {found.location}" if found.location else ""))
        return found

    def _context_for(self, finding: Finding) -> RemedyContext:
        return RemedyContext(finding, self.targets, self._step, self._context, self._step_ema, self._cleanups)

    def _treat(self, finding: Finding) -> bool:
        """Start the first allowed, applicable remedy not yet tried on this finding."""
        tried = self._tried.setdefault(finding.key, set())
        for name in self.settings.remedies:
            part = f"remedy {name}"
            remedy_class = None if name in tried else self._guard.call(part, remedies.load, name)
            if remedy_class is None or finding.cause not in remedy_class.treats:
                continue
            remedy = self._guard.call(part, remedy_class)
            ctx = self._context_for(finding)
            if remedy is None or not self._guard.call(part, remedy.applicable, ctx, default=False):
                continue
            tried.add(name)
            detail = self._guard.call(part, remedy.apply, ctx)
            if part in self._guard.off:
                finding.remedy = RemedyOutcome(name, self._step, effective=False, error=self._error(part))
                continue
            finding.remedy = RemedyOutcome(name, self._step, detail=detail or "")
            self._treatments.append(_Treatment(remedy, finding, self._step))
            self._monitor.busy(finding.explains)
            self._say(f"step {self._step}: applied {name} for {finding.cause}" + (f": {detail}" if detail else ""))
            return True
        return False

    def _timed_remedies(self) -> None:
        if self._treatments:
            start = time.perf_counter()
            self._treat_step()
            self._remedy_seconds += time.perf_counter() - start

    def _treat_step(self) -> None:
        for treatment in list(self._treatments):
            part = f"remedy {treatment.remedy.name}"
            self._guard.call(part, treatment.remedy.on_step, self._context_for(treatment.finding))
            if part in self._guard.off:
                self._treatments.remove(treatment)
                outcome = treatment.finding.remedy
                if outcome is not None:
                    outcome.effective, outcome.error = False, self._error(part)
                self._monitor.quiet(treatment.finding.explains)

    def _verify(self, minimum: int | None = None) -> None:
        for treatment in list(self._treatments):
            finding = treatment.finding
            if treatment.verified or self._monitor.windows_since(finding.metric, treatment.since) < (
                    minimum or self.settings.verify_windows):
                continue
            self._judge(treatment)

    def _judge(self, treatment: _Treatment) -> None:
        finding, remedy = treatment.finding, treatment.remedy
        outcome = finding.remedy
        assert outcome is not None
        after = self._monitor.trend_since(finding.metric, treatment.since)
        series = self._monitor.series[finding.metric]
        if after.growing and not is_material(series.spec.unit, after.slope, series.end or 0.0, self.settings.horizon,
                                             series.spec.limit):
            after = dataclasses.replace(after, kind="flat")  # what is left is too small to be a leak
        worked = bool(self._guard.call(f"remedy {remedy.name}", remedy.worked, finding.rate_per_step, after,
                                       default=False))
        outcome.effective, outcome.rate_after = worked, after.slope
        treatment.verified = True
        self._say(f"step {self._step}: {remedy.name} {'worked' if worked else 'did NOT work'} on {finding.cause} "
                  f"({format_value(finding.rate_per_step, finding.unit)}/step before, "
                  f"{format_value(after.slope, finding.unit)}/step after)")
        if worked:
            self._monitor.watch(finding.explains, since=self._step)
            return
        self._treatments.remove(treatment)
        if self._guard.call(f"remedy {remedy.name}", remedy.undo, self._context_for(finding), default=False):
            outcome.detail += "; undone"
        self._notes.append(f"step {self._step}: {remedy.name} did not stop {finding.cause} on {finding.metric}")
        if not self._treat(finding):
            self._monitor.quiet(finding.explains)

    def _error(self, part: str) -> str:
        return next((e["error"] for e in reversed(self._guard.errors) if e["part"] == part), "failed")

    # --- the end ---------------------------------------------------------------------------------

    def _conclude_pending(self) -> None:
        if self._investigation is not None:
            if self._step - self._investigation.start_step >= self._investigation.length // 2:
                self._conclude()
            else:
                self._investigation.abort(self._step)
                self._investigation = None
        self._verify(minimum=3)

    def _final_findings(self) -> tuple[list[Finding], list[str]]:
        """Copies of the findings with rates refit over the whole run; growth that stopped on its own
        (no remedy) is dropped from the findings and noted instead."""
        final, notes = [], []
        for finding in self._findings:
            copy = dataclasses.replace(finding, remedy=dataclasses.replace(finding.remedy) if finding.remedy else None)
            series = self._monitor.series.get(finding.metric)
            if series is not None and not (copy.remedy and copy.remedy.effective):
                until = copy.remedy.applied_step if copy.remedy else None
                steps, values = series.history(since=finding.first_step - 1, until=until)
                if len(values) >= 2 * self.settings.window:
                    rate, low, high = theil_sen(steps, values)
                    copy.rate_per_step, copy.rate_interval = rate, (low, high)
                if copy.remedy is None and self._stopped(finding):
                    notes.append(self._stopped_note(finding))
                    continue
            final.append(copy)
        return final, notes

    def _stopped_note(self, finding: Finding) -> str:
        """Why a growth that stopped is not reported: a remedy applied for another finding on the same
        metric stopped it, or it stopped by itself."""
        head = f"{finding.metric} grew from step {finding.first_step}"
        for other in self._findings:
            remedy = other.remedy
            if other.metric == finding.metric and remedy and remedy.effective \
                    and remedy.applied_step >= finding.detected_step:
                return (f"{head} ({finding.cause}) and stopped after {remedy.name}, applied at step "
                        f"{remedy.applied_step} for {other.cause}")
        return f"{head} and stopped by itself after step {finding.detected_step}: not a leak"

    def _stopped(self, finding: Finding) -> bool:
        """Did the growth stop by itself after detection (enough windows, and no significant trend)?"""
        if self._monitor.windows_since(finding.metric, finding.detected_step) < 2 * self.settings.verify_windows:
            return False
        after = self._monitor.trend_since(finding.metric, finding.detected_step)
        return not after.growing and after.slope <= 0.25 * finding.rate_per_step

    def _build_summary(self) -> Summary:
        findings, notes = self._final_findings()
        return Summary(
            framework=self.framework,
            steps=self._step,
            series={name: self._series_summary(name) for name in self._monitor.series},
            findings=findings,
            projected_limit_step=self._projection(findings),
            overhead=self._overhead(),
            notes=list(dict.fromkeys(self._notes + notes)),
            errors=list(self._guard.errors),
            rank=self.settings.rank,
            version=__version__,
            settings=self._settings_record(),
        )

    def _settings_record(self) -> dict[str, Any]:
        st = self.settings
        return {"remedies": list(st.remedies), "warmup": st.warmup, "window": st.window, "horizon": st.horizon,
                "memory_limit": st.memory_limit, "sample_stride": self._sampler.every}

    def _bare_summary(self) -> Summary:
        return Summary(self.framework, self._step, {}, list(self._findings), notes=list(self._notes),
                       errors=list(self._guard.errors), rank=self.settings.rank, version=__version__)

    def _series_summary(self, name: str) -> SeriesSummary:
        series = self._monitor.series[name]
        steps, values = series.history(since=self.settings.warmup)
        gap = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
        points_per_window = max(1, round(self.settings.window / gap))  # windows are spans of steps
        trend = classify(steps, values, points_per_window, self.settings.alpha)
        slope = theil_sen(steps, values)[0] if len(values) >= 2 else 0.0
        end = series.end or 0.0
        kind = trend.kind
        if trend.growing and not is_material(series.spec.unit, trend.slope, end, self.settings.horizon,
                                             series.spec.limit):
            kind = "flat"
        start = series.start if series.start is not None else end
        return SeriesSummary(series.spec.unit, start, end, float(series.peak), slope, kind, series.points)

    def _projection(self, findings: list[Finding]) -> int | None:
        """The first step at which an unremedied leak is projected to reach its metric's limit."""
        steps = []
        for finding in findings:
            series = self._monitor.series.get(finding.metric)
            if finding.benign or (finding.remedy and finding.remedy.effective) or series is None:
                continue
            left = steps_to_limit(series.end or 0.0, finding.rate_per_step, series.spec.limit)
            if left is not None:
                steps.append(self._step + int(left))
        return min(steps) if steps else None

    def _overhead(self) -> dict[str, float]:
        """The doctor's monitoring time against the whole step: the user's code plus the remedies, whose
        time is the step's work done for it (force_eval evaluates what the step left lazy)."""
        step_time = self._user_seconds + self._remedy_seconds
        return {
            "probe_seconds": self._probe_seconds,
            "forensic_seconds": self._forensic_seconds,
            "remedy_seconds": self._remedy_seconds,
            "step_seconds": self._user_seconds,
            "fraction_of_step_time": self._probe_seconds / step_time if step_time else 0.0,
            "investigations": self._investigations,
        }

    def _emit(self, summary: Summary) -> None:
        """Write the JSON (stderr if the path fails), the plot, and print the table on rank 0."""
        path = self.settings.summary_path
        if path is not None:
            try:
                summary.write(path)
            except OSError as err:
                self._guard.disable("summary_path", f"cannot write {path}: {err}; the summary follows on stderr")
                print(summary.to_json(), file=sys.stderr)
        if self.settings.plot_path is not None:
            self._guard.call("plot", summary.plot, self.settings.plot_path)
        if self.settings.verbose and self.settings.rank == 0:
            print(summary.text(), file=sys.stderr)

    def _say(self, message: str) -> None:
        if self.settings.verbose and self.settings.rank == 0:
            print(f"leakdoctor: {message}", file=sys.stderr)


def _finish_at_exit(ref: "weakref.ReferenceType[LeakDoctor]") -> None:
    """Write the summary at interpreter exit if the run never called finish()."""
    doctor = ref()
    if doctor is not None:
        doctor.finish()
