"""The doctor's state and the work of a step that does something; the public LeakDoctor (doctor.py) holds one.

An Engine is built from the settings and a framework part (framework.py), and wires the parts together
(_reading/, _judging/, _lifecycle/, reporting/). It never holds the LeakDoctor that owns it: what is
registered to finish a run nobody finished (_unattended.py: interpreter exit, SIGTERM, the doctor's
collection) holds the engine, so a dropped doctor is still collected, and its engine finishes then.

A sampled step goes to the sampler (_reading/sampling.py: read the due probes, record, pace); when a window
closed or the clinic has work open, the clinic takes over (_judging/clinic.py: investigate, diagnose, treat,
verify); the limit watch (_lifecycle/stopping.py) looks at what the clinic found. The summary is built by
the engine (build_summary) and finished by _closing.py, and written while the run goes by _lifecycle/heartbeat.py (so that a SIGKILL leaves it on disk).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
import weakref
from functools import partial
from typing import Any, Mapping, Sequence

from leakdoctor._base import logs
from leakdoctor._base.guard import Guard
from leakdoctor._base.messages import unique
from leakdoctor._base.integration import Integration
from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.version import __version__
from leakdoctor.framework import Framework
from leakdoctor.integrations import _limits as limits, _process as process, _python as python
from leakdoctor._judging.clinic import Clinic, Practice
from leakdoctor._judging.diagnosis import GENERIC_RULES
from leakdoctor._lifecycle import oom, stopping
from leakdoctor._lifecycle.heartbeat import Heartbeat
from leakdoctor._reading.monitor import Monitor
from leakdoctor._reading.probing import Probes
from leakdoctor._reading.sampling import STEP_CPU, STEP_TIME, Sampler
from leakdoctor.reporting import _exporter as exporter, _report as report
from leakdoctor.reporting.summary import Summary, verdict_of
from leakdoctor.settings import Settings
from leakdoctor.trackers import feed

__all__ = ["Engine"]


class Engine:
    """The doctor's state: its settings, its framework part, the parts it wired (probes, monitor, clinic,
    sampler, limit watch, heartbeat, exporter), its step count and the step of the next sample. The public
    LeakDoctor counts the `quiet` steps itself (those with nothing to do but be counted: one decrement and
    one comparison, the cheapest test a step can pay), and hands the others to `step`."""

    def __init__(self, settings: Settings, part: Framework) -> None:
        self.settings, self.part = settings, part
        self.guard = part.guard if part.guard is not None else Guard()
        self.watchlist = python.Watchlist(self.guard)
        self.memory = limits.process_limit(settings.memory_limit)
        parts = [process.integration(self.memory, settings.sampling_budget), python.integration(self.watchlist),
                 *part.integrations]
        self.probes = self._new_probes(parts)
        self.targets: dict[str, Any] = {k: v for p in parts for k, v in p.targets.items()}
        self.monitor = Monitor(settings)
        self.clinic = Clinic(settings, self.monitor, self._practice(parts), self.guard, self.say)
        self.last_looks = [look for p in parts for look in p.last_looks]  # at finish: _judging/last_look.py
        self.limit_watch = self._new_limit_watch()
        #: whether the ranks of a distributed run agree on the stop (then every step asks `agree_if_due`)
        self.shared = isinstance(self.limit_watch, stopping.SharedLimitWatch)
        self.snapshot = oom.Snapshot(settings.oom_snapshot)
        self.reserve = oom.Reserve()  # let go of at the end: room for the summary where memory ran out
        self.sampler = Sampler(settings, self.probes, self.monitor, self.guard)
        # The summary written while the run goes (heartbeat=, oom_watermark=), so that a SIGKILL leaves it
        self.heartbeat = Heartbeat(settings, self.memory, self.monitor, self.clinic, self.guard, self.interim_summary)
        self.steps = 0
        self.next_sample: float = 1  # the step of the next sample (inf once switched off)
        #: steps left that the doctor's step() only counts: the steps before the next sample while nothing
        #: else is due (no remedy acting, no window open, no agreement of ranks to check), else 0
        self.quiet: float = 0
        self.idle = True
        self.result: Summary | None = None  # the final summary, once finish() built it
        #: how the run was finished without the script's finish(): "exit", "collected", "SIGTERM" (_unattended.py)
        self.unattended: str | None = None
        #: Lightning turns SIGTERM into an exception its callback sees (_lifecycle/termination.py reads this)
        self.framework_handles_sigterm = part.sigterm == "framework"
        # One thread at a time past the countdown: steps from two threads, a summary polled from a third
        # (an exporter), a gauge added mid-run. Reentrant, so that a signal handler that finishes the
        # doctor in the middle of a step does not wait for itself.
        self.lock = threading.RLock()
        _LIVE.add(self)  # a fork re-creates the lock in the child (_new_locks_in_child)
        self.publisher: exporter.Publisher | None = None
        self.trackers: feed.Feed | None = None  # trackers=: fed as the exporter is (start_publisher)
        self.registration: Any = None  # unattended.Registration, once the doctor registered its ending
        self.termination_key: int | None = None  # _lifecycle/termination.py's key: the doctor's id (_unattended.py)

    def _new_probes(self, parts: Sequence[Integration]) -> Probes:
        step_specs = {name: MetricSpec(name, "seconds", role="supporting", source="process")
                      for name in (STEP_TIME, STEP_CPU)}
        return Probes([p for part in parts for p in part.probes], step_specs, self.guard)

    def _practice(self, parts: Sequence[Integration]) -> Practice:
        """What an investigation may use: every part's forensics (but those the framework leaves out),
        clean-ups and rules, the generic rules last."""
        return Practice(forensics=[f for p in parts for f in p.forensics if self.part.keeps(f)],
                        cleanups=[c for p in parts for c in p.cleanups],
                        rules=[r for p in parts for r in p.rules] + GENERIC_RULES,
                        targets=self.targets, read=self.probes.read_all, read_for=self.probes.read_for,
                        spec=self.probes.spec)

    def _new_limit_watch(self) -> stopping.LimitWatch:
        """What acts on on_limit: this process's own watch, or, when the framework's ranks agree on the stop
        (`Framework.stop_agreement`), this rank's share of the run's (SharedLimitWatch)."""
        settings = self.settings
        agree = self.part.stop_agreement() if settings.on_limit == "stop" else None
        if agree is None:
            return stopping.LimitWatch(settings, self.guard, self.limit_of, self.say)
        return stopping.SharedLimitWatch(settings, self.guard, self.limit_of, self.say, agree=agree,
                                         every=settings.window, rank=settings.rank,
                                         checkpoint_here=self.part.checkpoint_on_every_rank or settings.rank == 0)

    def start_publisher(self) -> None:
        """The framework's Prometheus feed, else this doctor's own server when `prometheus_port` is set. Last
        of the construction but for the registrations: a bad port raises here, with nothing registered."""
        make = self.part.publisher
        self.publisher = (make(self.settings, self.guard) if make is not None
                          else exporter.publisher_for(self.settings, self.part.name, self.guard))
        self.trackers = feed.feed_for(self.settings, self.guard)

    def start_thread(self) -> None:
        """Watch resident memory on the sampler thread (_reading/thread.py): it wakes the next step (`wake`),
        and raises the memory alarm."""
        beat = self.heartbeat
        self.sampler.start_thread(wake=self.wake, step_of=partial(getattr, self, "steps"),
                                  alarm=self.memory_alarm, watermark=lambda: beat.resident_watermark)

    def memory_alarm(self, step: int, rss: float) -> None:
        """From the sampler thread: resident memory passed the watermark. The post-mortem is written now,
        unless a step holds the doctor (it writes it then, from the series)."""
        if self.lock.acquire(blocking=False):
            try:
                if self.result is None:
                    self.guard.call("heartbeat", self.heartbeat.passed, step, rss)
            finally:
                self.lock.release()

    def wake(self) -> None:
        """Sample the next step. From any thread: a step that overwrites `quiet` meanwhile only delays the
        sample to the end of its quiet steps, since `next_sample` stays passed."""
        self.next_sample = self.quiet = 0

    # --- a step that does something ----------------------------------------------------------------

    def step(self, context: Mapping[str, Any]) -> None:
        """A step past the quiet ones: work if a sample is due or the clinic is busy, agree with the other
        ranks where they do, and count the quiet steps up to the next sample."""
        if self.steps + 1 < self.next_sample and self.idle:
            self.steps += 1
        else:
            with self.lock:
                self.work(context)
        if self.shared:  # the ranks of a distributed run agree on the stop at the same steps
            self.agree_if_due()
        self.quiet = self.next_sample - self.steps - 1 if self.idle and not self.shared else 0

    def stop_counting(self) -> None:
        """The run ended: every later step goes to `work`, which counts none."""
        self.idle, self.quiet = False, 0

    def work(self, context: Mapping[str, Any]) -> None:
        """The part of a step that does something: remedies, and a sample when one is due."""
        start = time.perf_counter()
        if self.result is not None:
            self.idle = False
            return
        if "leakdoctor" in self.guard.off:  # switched off: steps are still counted, as quiet ones
            self.steps += 1
            self.next_sample, self.idle = math.inf, True
            return
        # The doctor's CPU time is this thread's, measured: its wall time would overstate it on a busy
        # machine (preempted mid-sample), and taken off the process's CPU time it would hide the user's
        cpu = time.thread_time()
        self.steps += 1
        clinic = self.clinic
        before = (clinic.forensic_seconds, clinic.remedy_seconds, self.probes.paced_seconds, self.heartbeat.seconds)
        investigating = clinic.investigation is not None
        sampled = clinic.watching or self.steps >= self.next_sample
        try:
            if clinic.treatments:
                clinic.treat_step(self.steps, context, self.sampler.step_seconds)
            if sampled:
                self._sample(start, investigating, context)
        except Exception as err:  # noqa: BLE001 - a bug in leakdoctor must not end the user's run
            self.guard.disable("leakdoctor", f"{type(err).__name__}: {err}")
            self.guard.call("abandon", clinic.abandon, self.steps)
        if sampled:  # on every sample, so that the watch knows how far apart samples are
            self.guard.call("limit watch", self.limit_watch.check, self.steps, clinic.findings, self.monitor,
                            self.summary_now)
        if self.heartbeat.active:  # the summary so far, when a finding changed, a heartbeat is due or memory runs out
            self.guard.call("heartbeat", self.heartbeat.check, start, self.steps)
        self._charge(start, cpu, before, investigating, sampled)
        self.idle = clinic.idle

    def _charge(self, start: float, cpu: float, before: tuple[float, float, float, float], investigating: bool,
                sampled: bool) -> None:
        """Charge the step's time to the doctor. Investigations sample every step, with a budget of their
        own; so do self-pacing probes; and a hurry (a rising metric sampled twice a window) is spent on
        purpose; a heartbeat's write is the doctor's time but no sample's cost."""
        forensic, remedy, paced, written = before
        clinic, sampler = self.clinic, self.sampler
        wall = time.perf_counter() - start
        own = wall - (clinic.forensic_seconds - forensic) - (clinic.remedy_seconds - remedy)
        paid = not investigating and clinic.forensic_seconds == forensic and self.steps >= sampler.hurry_until
        sampler.charge(self.steps, wall, own, time.thread_time() - cpu,
                       max(0.0, own - (self.probes.paced_seconds - paced) - (self.heartbeat.seconds - written))
                       if paid else None, sampled)

    def _sample(self, start: float, investigating: bool, context: Mapping[str, Any]) -> None:
        """Take a sample, hand the completed windows (or the open work) to the clinic, set the next."""
        clinic, sampler = self.clinic, self.sampler
        completed = sampler.sample(self.steps, start, investigating, every_step=clinic.watching)
        if completed or not clinic.idle:
            clinic.after_sample(self.steps, completed, context, sampler.step_seconds, sampler.user_seconds,
                                sampler.own_seconds + sampler.thread_seconds)
        self.next_sample = self.steps + sampler.steps_to_next(self.steps)
        if self.publisher is not None:
            self.guard.call("prometheus", self.publish)
        if self.trackers is not None:
            self.guard.call("trackers", self.publish, None, self.trackers)

    def agree_if_due(self) -> None:
        """After every step of a doctor whose ranks agree on the stop (`shared`): at the agreement steps,
        settle."""
        if self.limit_watch.due() and self.result is None:
            self._settle()

    def _settle(self) -> None:
        """The ranks agree whether to stop, all at this step; the time is the doctor's own (its overhead)."""
        with self.lock:
            start, cpu = time.perf_counter(), time.process_time()
            self.guard.call("stop agreement", self.limit_watch.settle, self.steps, self.sampler.step_seconds)
            wall = time.perf_counter() - start
            self.sampler.charge(self.steps, wall, wall, time.process_time() - cpu, None, False)

    # --- what the parts call back -------------------------------------------------------------------

    def say(self, message: str) -> None:
        """A live message (the clinic's, the limit watch's), in the framework's words: printed on rank 0
        when `verbose`; an alert (logs.Alert) also goes to logging, on every rank."""
        message = self.part.words(message)
        logs.alert(message, rank=self.settings.rank)
        if self.settings.verbose and self.settings.rank == 0:
            print(f"leakdoctor: {message}", file=sys.stderr)

    def limit_of(self, metric: str) -> dict[str, Any] | None:
        """The summary's `memory_limit` entry for a metric: which limit it was held to, and why."""
        series = self.monitor.series.get(metric)
        return limits.describe(series.spec if series else None, self.memory, self.settings.memory_limit)

    def summary_now(self) -> Summary:
        """The final summary after finish(), else a snapshot of the run so far."""
        with self.lock:
            if self.result is not None:
                return self.result
            summary = self.guard.call("summary", self.build_summary) or self.bare_summary()
            return dataclasses.replace(summary, complete=False)  # a snapshot: the run goes on

    def interim_summary(self) -> Summary:
        """The summary so far, as the heartbeat writes it while the run goes (heartbeat.py): this doctor's
        own view, built inside a step, as the framework completes it (never waiting on other processes)."""
        return self.part.interim(self.build_summary())

    @property
    def readings(self) -> dict[str, float]:
        """The latest value of every series."""
        with self.lock:
            return {name: s.end for name, s in self.monitor.series.items() if s.end is not None}

    # --- summaries ----------------------------------------------------------------------------------

    def build_summary(self) -> Summary:
        """The summary of the run so far, as the framework continues it."""
        settings, monitor, steps = self.settings, self.monitor, self.steps
        findings = report.final_findings(self.clinic.findings, monitor, settings)
        first = min(report.projections(findings, monitor, steps), key=lambda p: p.step, default=None)
        return self.part.continues(Summary(
            framework=self.part.name,
            steps=steps,
            series={name: report.series_summary(monitor, name, settings) for name in monitor.series},
            findings=findings,
            projected_limit_step=first.step if first else None,
            overhead=self.overhead(),
            notes=unique(self.clinic.notes + report.skipped_notes(monitor)),
            errors=list(self.guard.errors),
            rank=settings.rank,
            version=__version__,
            settings=report.settings_record(settings, self.sampler.pacer.every),
            memory_limit=self.limit_of(first.metric if first else "rss_bytes"),
            stopped=self.limit_watch.stopped,
            stopped_by=self.limit_watch.stopped_by,
            unwatched=self.unwatched(),
        ))

    def bare_summary(self) -> Summary:
        """The summary when building the full one failed: what the clinic holds, no series."""
        return Summary(self.part.name, self.steps, {}, list(self.clinic.findings), notes=list(self.clinic.notes),
                       errors=list(self.guard.errors), rank=self.settings.rank, version=__version__,
                       memory_limit=self.memory.record(), stopped=self.limit_watch.stopped,
                       stopped_by=self.limit_watch.stopped_by, unwatched=self.unwatched())

    def unwatched(self) -> dict[str, Any] | None:
        return report.unwatched(self.settings, self.steps, self.guard.engine_error())

    def overhead(self) -> dict[str, float]:
        """The doctor's overhead; in a distributed run, with the stop agreements' count and time (already
        in its total)."""
        overhead = report.overhead(self.sampler, self.clinic, self.settings)
        watch = self.limit_watch
        if isinstance(watch, stopping.SharedLimitWatch):
            overhead.update(stop_agreements=watch.agreements, stop_agreement_seconds=watch.agree_seconds)
        return overhead

    def publish(self, final: Summary | None = None, to: Any = None) -> None:
        """Hand the exporter (or `to`: the trackers' feed, which takes the same) what this sample left
        (readings, findings, projection, overhead, the verdict so far), or at finish() the `final`
        summary's values."""
        to = to if to is not None else self.publisher
        assert to is not None
        if final is not None:
            to.publish(final.steps, self.readings, final.findings, final.projected_limit_step, final.overhead,
                       final.verdict)
            return
        findings = self.clinic.findings
        verdict = verdict_of(findings)
        if verdict == "clean" and self.unwatched():
            verdict = "unwatched"
        to.publish(self.steps, self.readings, findings, report.projection(findings, self.monitor, self.steps),
                   self.overhead(), verdict)


#: The engines of this process, for _new_locks_in_child (weak: a dropped doctor's is still collected).
_LIVE: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _new_locks_in_child() -> None:
    """In a forked child, a fresh lock for every doctor: the fork may have come while the sampler thread
    held the parent's (writing the post-mortem at the memory alarm), and that thread does not exist in
    the child, so the inherited lock would stay held for good and the child's first step() would wait on
    it forever (a DataLoader or multiprocessing worker that steps the inherited doctor)."""
    for engine in list(_LIVE):
        engine.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)
