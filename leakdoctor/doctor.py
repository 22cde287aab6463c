"""The engine's front: the public LeakDoctor, which wires the parts together and runs them in order.

A step that is not sampled costs a countdown. A sampled step goes to the sampler (reading/sampling.py:
read the due probes, record, pace); when a window closed or the clinic has work open, the clinic takes over
(judging/clinic.py: investigate, diagnose, treat, verify); the limit watch (lifecycle/stopping.py) looks at
what the clinic found. The summary is built by reporting/report.py, and written while the run goes by
lifecycle/heartbeat.py (so that a SIGKILL leaves it on disk). Data flows one way: probes → series →
detector → investigation → diagnosis → remedy → verification → summary (reading/, then judging/, then
reporting/; lifecycle/ watches the run throughout).
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import os
import sys
import threading
import time
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

from leakdoctor.base.findings import Finding
from leakdoctor.base.guard import Guard
from leakdoctor.base.integration import Integration
from leakdoctor.base.messages import msg, unique
from leakdoctor.base.metric import UNITS, MetricSpec
from leakdoctor.base.version import __version__
from leakdoctor.integrations import limits, process, python
from leakdoctor.judging import last_look
from leakdoctor.judging.clinic import Clinic, Practice
from leakdoctor.judging.diagnosis import GENERIC_RULES
from leakdoctor.lifecycle import oom, stopping, termination
from leakdoctor.lifecycle.heartbeat import Heartbeat
from leakdoctor.options import refuse_unknown
from leakdoctor.reading.monitor import Monitor
from leakdoctor.reading.probing import Probes
from leakdoctor.reading.sampling import STEP_CPU, STEP_TIME, Sampler
from leakdoctor.remedies.base import Remedy
from leakdoctor.reporting import exporter, report
from leakdoctor.reporting.summary import Summary, verdict_of
from leakdoctor.settings import DoctorOptions, Settings, documented

if TYPE_CHECKING:
    from typing_extensions import Unpack

STATE_SCHEMA = "leakdoctor.state/1"


@documented
class LeakDoctor:
    """Watches memory while a model trains, tells a leak from normal growth, names its cause, applies a
    remedy when allowed and checks that it worked.

    Call `step()` at the end of every training step and `finish()` at the end, or use it as a context
    manager; `summary` is a snapshot of the run so far, and the final summary once `finish()` returned.
    This doctor watches the process and Python objects; `leakdoctor.callbacks.torch`, `.flax` and `.mlx`
    each have a `LeakDoctor` that adds its framework's probes, forensics and remedies. They share one
    class name on purpose: the module says the
    framework, so moving a loop to another framework changes one import and nothing else.

    Args:
        integrations: extra probes, forensics, rules and remedies (`leakdoctor.integrations.Integration`);
            the framework doctors pass their own. Rarely needed otherwise.
        **options: the options shared by every doctor and callback, listed below and in the README's
            "Options" table (`leakdoctor.settings.OPTIONS`).

    Raises:
        UnknownOptionError: an option name it does not take, with the nearest valid one ("remedys: did
            you mean remedies?"); a ValueError and a TypeError both.
        ValueError: a bad option value, named with the valid ones.

    Example:
        >>> from leakdoctor import LeakDoctor
        >>> with LeakDoctor(remedies="safe", summary_path="leaks.json") as doctor:  # doctest: +SKIP
        ...     for batch in data:
        ...         train_step(batch)
        ...         doctor.step()
        >>> doctor.summary.verdict  # doctest: +SKIP
        'clean'
    """

    framework: ClassVar[str] = "python"
    #: Whether every rank calls `checkpoint=` when the ranks of a distributed run stop together: in a loop
    #: rank 0 alone does (one checkpoint; the weights are the same on every rank); every rank when saving
    #: is itself a collective (Lightning's save_checkpoint, JAX's orbax).
    checkpoint_on_every_rank: ClassVar[bool] = False

    def __init__(self, *, integrations: Sequence[Integration] = (), **options: Unpack[DoctorOptions]) -> None:
        refuse_unknown(type(self), options)
        self.settings = Settings.create(**options)
        self._guard = Guard()
        self._watchlist = python.Watchlist(self._guard)
        self._memory = limits.process_limit(self.settings.memory_limit)
        parts = [process.integration(self._memory, self.settings.sampling_budget),
                 python.integration(self._watchlist), *integrations]
        self._probes = Probes([p for part in parts for p in part.probes], {
            name: MetricSpec(name, "seconds", role="supporting", source="process") for name in (STEP_TIME, STEP_CPU)},
            self._guard)
        self.targets: dict[str, Any] = {k: v for part in parts for k, v in part.targets.items()}
        self._monitor = Monitor(self.settings)
        practice = Practice(forensics=self._forensics(parts),
                            cleanups=[c for part in parts for c in part.cleanups],
                            rules=[r for part in parts for r in part.rules] + GENERIC_RULES,
                            targets=self.targets, read=self._probes.read_all, read_for=self._probes.read_for,
                            spec=self._probes.spec)
        # The parts call back into the doctor through its state, never through the doctor itself (see
        # _register_ending): a part that held the doctor would keep a dropped doctor from being collected.
        say, limit_of = _Late(type(self), self.__dict__, "_say"), _Late(type(self), self.__dict__, "_limit_of")
        self._clinic = Clinic(self.settings, self._monitor, practice, self._guard, say)
        self._last_looks = [look for part in parts for look in part.last_looks]  # at finish: judging/last_look.py
        self._limit_watch = self._new_limit_watch(limit_of, say)
        #: whether the ranks of a distributed run agree on the stop (the subclass's step() then settles)
        self._shared = isinstance(self._limit_watch, stopping.SharedLimitWatch)
        self._snapshot = oom.Snapshot(self.settings.oom_snapshot)
        self._sampler = Sampler(self.settings, self._probes, self._monitor, self._guard)
        # The summary written while the run goes (heartbeat=, oom_watermark=), so that a SIGKILL leaves it
        self._heartbeat = Heartbeat(self.settings, self._memory, self._monitor, self._clinic, self._guard,
                                    _Late(type(self), self.__dict__, "_interim_summary"))
        self._step = 0
        self._countdown = 1  # steps to the next sample: kept here, so that an unsampled step reads no other object
        self._idle = True
        self._result: Summary | None = None
        # One thread at a time past the countdown: steps from two threads, a summary polled from a third
        # (an exporter), a gauge added mid-run. Reentrant, so that a signal handler that finishes the
        # doctor in the middle of a step does not wait for itself.
        self._lock = threading.RLock()
        _LIVE.add(self)  # a fork re-creates the lock in the child (_new_locks_in_child)
        # The exporter last but for the registrations: a bad port raises here, with nothing registered.
        self._publisher = self._new_publisher()
        self._register_ending()
        if self.settings.sampler != "inline":
            self._start_thread()

    def _start_thread(self) -> None:
        """Watch resident memory on the sampler thread (reading/thread.py). What it is given reaches the
        doctor's state, never the doctor (see _register_ending): it wakes the next step by zeroing the
        countdown, and raises the memory alarm through _Late."""
        state, beat = self.__dict__, self._heartbeat
        self._sampler.start_thread(wake=partial(state.__setitem__, "_countdown", 0),
                                   step_of=partial(state.__getitem__, "_step"),
                                   alarm=_Late(type(self), state, "_memory_alarm"),
                                   watermark=lambda: beat.resident_watermark)

    def _memory_alarm(self, step: int, rss: float) -> None:
        """From the sampler thread: resident memory passed the watermark. The post-mortem is written now,
        unless a step holds the doctor (it writes it then, from the series)."""
        if self._lock.acquire(blocking=False):
            try:
                if self._result is None:
                    self._guard.call("heartbeat", self._heartbeat.passed, step, rss)
            finally:
                self._lock.release()

    def _register_ending(self) -> None:
        """A run nobody finished still writes its summary: at interpreter exit, on SIGTERM, at the end of a
        multiprocessing child (a DataLoader or Pool worker ends by os._exit, after multiprocessing's
        finalizers but without atexit), and when the doctor is dropped and garbage-collected (a doctor
        built in a function that returned). What is registered holds the doctor's state (its __dict__,
        which holds nothing that leads back to the doctor), never the doctor: a dropped doctor is
        collected, finishes then from its state (_finish_unattended), and gives back its descriptor and
        memory; finish() unregisters it all. A copy inherited through a fork is the parent's to finish:
        the child's exit, signal or collection leaves it alone (its process id is not the child's)."""
        cls, state = type(self), self.__dict__
        self._pid = os.getpid()
        self._termination_key = id(self)
        self._unattended: str | None = None
        self._ending = weakref.finalize(self, _finish_unattended, cls, state, "collected")
        self._ending.atexit = False  # at exit, the atexit entry below finishes it, in its place among the handlers
        self._atexit = partial(_finish_unattended, cls, state, "exit")
        atexit.register(self._atexit)
        self._child_exit = _child_finalizer(self._atexit)
        termination.register(self, partial(_finish_unattended, cls, state, "SIGTERM"), weak=True)

    def _forensics(self, parts: Sequence[Integration]) -> list[Any]:
        """The forensics an investigation may run: every part's (a subclass may leave some out)."""
        return [f for part in parts for f in part.forensics]

    def _stop_agreement(self) -> stopping.Agree | None:
        """How the ranks of a distributed run agree to stop (asked only when on_limit="stop"): the framework's
        collective (a framework doctor's); None: this process stops alone."""
        return None

    def _new_limit_watch(self, limit_of: Callable[[str], dict[str, Any] | None],
                         say: Callable[[str], None]) -> stopping.LimitWatch:
        """What acts on on_limit: this process's own watch, or, when the ranks agree (_stop_agreement), this
        rank's share of the run's (SharedLimitWatch: a subclass's step() calls _agree_if_due)."""
        agree = self._stop_agreement() if self.settings.on_limit == "stop" else None
        if agree is None:
            return stopping.LimitWatch(self.settings, self._guard, limit_of, say)
        rank = self.settings.rank
        return stopping.SharedLimitWatch(self.settings, self._guard, limit_of, say, agree=agree,
                                         every=self.settings.window, rank=rank,
                                         checkpoint_here=self.checkpoint_on_every_rank or rank == 0)

    def _agree_if_due(self) -> None:
        """After a step of a doctor whose ranks agree on the stop (`_shared`, checked by the caller so that
        any other run pays one attribute read): at the agreement steps, settle."""
        if self._limit_watch.due() and self._result is None:
            self._settle()

    def _settle(self) -> None:
        """The ranks agree whether to stop, all at this step; the time is the doctor's own (its overhead)."""
        with self._lock:
            start, cpu = time.perf_counter(), time.process_time()
            self._guard.call("stop agreement", self._limit_watch.settle, self._step, self._sampler.step_seconds)
            wall = time.perf_counter() - start
            self._sampler.charge(self._step, wall, wall, time.process_time() - cpu, None, False)

    def _new_publisher(self) -> exporter.Publisher | None:
        """This doctor's Prometheus feed: its own server when `prometheus_port` is set (a subclass may feed
        another doctor's server instead)."""
        return exporter.publisher_for(self.settings, self.framework, self._guard)

    # --- what users call -------------------------------------------------------------------------

    def watch(self, name: str, gauge: Callable[[], float], unit: str = "count", timeout: float = 1.0) -> None:
        """Track a user gauge every step, e.g. `doctor.watch("nodes", lambda: len(graph.nodes))`. A gauge is
        paced by its measured cost, like a probe, and called on a worker thread; one whose call takes more
        than `timeout` seconds (or hangs, at any call) is switched off with a warning, and the loop goes on
        after at most `timeout` seconds (leakdoctor/reading/gauges.py)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"watch: name {name!r} must be a non-empty string")
        if self._probes.known(name) or self._watchlist.has(name):
            raise ValueError(f"watch: name {name!r} must be a new name, not one of a series the doctor records "
                             f"already (taken: {sorted(self._probes.names() | self._watchlist.names())})")
        if not callable(gauge):
            raise ValueError(f"watch({name!r}): gauge must be a callable returning a number, got {gauge!r}")
        if unit not in UNITS:
            raise ValueError(f"watch({name!r}): unit {unit!r}, expected one of {UNITS}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
            raise ValueError(f"watch({name!r}): timeout={timeout!r:.40}, expected seconds > 0 (at most a day), "
                             f"e.g. 1.0")
        with self._lock:
            self._watchlist.add_gauge(name, gauge, unit, float(timeout))

    def watch_object(self, obj: Any, name: str | None = None, include_private: bool = False) -> None:
        """Count the items of `obj`'s list/dict/set/tuple/deque attributes (or of `obj` itself if it is
        one) every step, so a container that keeps growing is named. Private attributes only if asked."""
        if obj is None:
            raise ValueError("watch_object: obj is None")
        label = name or type(obj).__name__
        if not isinstance(label, str) or not label:
            raise ValueError(f"watch_object: name {name!r} must be a non-empty string")
        with self._lock:
            self._watchlist.add_object(obj, label, include_private)

    def step(self, **context: Any) -> None:
        """Call once at the end of every training step. Keyword arguments (this step's arrays, loss,
        state) are handed to remedies that need them, e.g. force_eval evaluates them."""
        self._countdown -= 1
        if self._countdown > 0 and self._idle:
            self._step += 1
            return
        with self._lock:
            self._work(context)

    def _work(self, context: Mapping[str, Any]) -> None:
        """The part of a step that does something: remedies, and a sample when one is due."""
        start = time.perf_counter()
        if self._result is not None:
            self._idle = False
            return
        if "leakdoctor" in self._guard.off:  # switched off: steps are still counted, on the countdown's path
            self._step += 1
            self._countdown, self._idle = math.inf, True
            return
        # The doctor's CPU time is this thread's, measured: its wall time would overstate it on a busy
        # machine (preempted mid-sample), and taken off the process's CPU time it would hide the user's
        cpu = time.thread_time()
        self._step += 1
        clinic, sampler = self._clinic, self._sampler
        forensic, remedy, paced = clinic.forensic_seconds, clinic.remedy_seconds, self._probes.paced_seconds
        investigating = clinic.investigation is not None
        sampled = clinic.watching or self._countdown <= 0
        try:
            if clinic.treatments:
                clinic.treat_step(self._step, context, sampler.step_seconds)
            if sampled:
                self._sample(start, investigating, context)
        except Exception as err:  # noqa: BLE001 - a bug in leakdoctor must not end the user's run
            self._guard.disable("leakdoctor", f"{type(err).__name__}: {err}")
        if sampled:  # on every sample, so that the watch knows how far apart samples are
            self._guard.call("limit watch", self._limit_watch.check, self._step, clinic.findings, self._monitor,
                             self._summary_now)
        beat, written = self._heartbeat, self._heartbeat.seconds
        if beat.active:  # the summary so far, when a finding changed, a heartbeat is due or memory runs out
            self._guard.call("heartbeat", beat.check, start, self._step)
        wall = time.perf_counter() - start
        own = wall - (clinic.forensic_seconds - forensic) - (clinic.remedy_seconds - remedy)
        # investigations sample every step, with a budget of their own; so do self-pacing probes; and a
        # hurry (a rising metric sampled twice a window) is spent on purpose; a heartbeat's write is the
        # doctor's time but no sample's cost
        paid = not investigating and clinic.forensic_seconds == forensic and self._step >= sampler.hurry_until
        sampler.charge(self._step, wall, own, time.thread_time() - cpu,
                       max(0.0, own - (self._probes.paced_seconds - paced) - (beat.seconds - written)) if paid
                       else None, sampled)
        self._idle = clinic.idle

    def _sample(self, start: float, investigating: bool, context: Mapping[str, Any]) -> None:
        """Take a sample, hand the completed windows (or the open work) to the clinic, set the next."""
        clinic, sampler = self._clinic, self._sampler
        completed = sampler.sample(self._step, start, investigating, every_step=clinic.watching)
        if completed or not clinic.idle:
            clinic.after_sample(self._step, completed, context, sampler.step_seconds, sampler.user_seconds,
                                sampler.own_seconds + sampler.thread_seconds)
        self._countdown = sampler.steps_to_next(self._step)
        if self._publisher is not None:
            self._guard.call("prometheus", self._publish)

    def finish(self, exception: BaseException | None = None) -> Summary:
        """End the run: conclude what is pending, build the summary, write, plot and print it. Safe to
        call more than once (from any thread); later calls return the same summary. A SIGTERM that
        comes meanwhile takes effect once the summary is written (termination.finishing)."""
        with self._lock, termination.finishing():
            return self._end(exception)

    def _end(self, exception: BaseException | None) -> Summary:
        if self._result is not None:
            return self._result
        atexit.unregister(self._atexit)
        self._ending.detach()
        if self._child_exit is not None:
            self._child_exit.cancel()
        if self._unattended == "collected":
            self._clinic.notes.append(msg("collected", step=self._step))
        if exception is not None:
            self._clinic.notes.append(msg("ended", error=type(exception).__name__, step=self._step))
        self._sampler.account_user_time(self._step, time.perf_counter())
        self._idle = False
        self._sampler.stop_thread()
        self._guard.call("finish", self._clinic.conclude_pending, self._step)
        self._guard.call("last look", last_look.conclude, self._clinic, self._monitor, self.settings,
                         self._last_looks, self._step)
        self._probes.close()
        summary = self._guard.call("summary", self._build_summary) or self._bare_summary()
        summary = self._guard.call("post-mortem", oom.post_mortem, summary, exception, self._step, self._clinic.sites,
                                   self._monitor, self._snapshot) or summary
        summary = self._guard.call("complete summary", self._complete, summary, exception) or summary
        summary = _with_errors(summary, self._guard)  # a failed gathering of the ranks' summaries too
        self._result = summary
        if self._publisher is not None:  # the final values: pushed if asked, served for the linger
            self._guard.call("prometheus", self._publish, summary)
            exporter.conclude(self._publisher, self.settings, self._guard)
            summary.errors = _with_errors(summary, self._guard).errors  # a failed push: in the summary written next
        self._emit(summary)
        termination.unregister(self)  # only now: a SIGTERM while finishing still finds it
        return summary

    def _complete(self, summary: Summary, exception: BaseException | None) -> Summary:
        """The summary to write and print; a subclass adds what this process alone does not know (the
        other ranks' findings of a distributed run)."""
        return summary

    @property
    def summary(self) -> Summary:
        """The final summary after `finish()`, else a snapshot of the run so far."""
        return self._summary_now()

    def _summary_now(self) -> Summary:
        with self._lock:
            if self._result is not None:
                return self._result
            summary = self._guard.call("summary", self._build_summary) or self._bare_summary()
            return dataclasses.replace(summary, complete=False)  # a snapshot: the run goes on

    def _interim_summary(self) -> Summary:
        """The summary so far, as the heartbeat writes it while the run goes (heartbeat.py): this doctor's
        own view, built inside a step (a subclass may add what it holds besides, but must not wait on
        other processes here)."""
        return self._build_summary()

    def metrics_feed(self, **labels: str) -> exporter.Publisher | None:
        """A feed into this doctor's /metrics server for another doctor of the same run, whose series carry
        `labels` besides this doctor's (e.g. `clock="batch"`); None when this doctor serves no metrics."""
        return self._publisher.sibling(**labels) if self._publisher is not None else None

    @property
    def finished(self) -> bool:
        """True once `finish()` ended the run (then `summary` is final)."""
        return self._result is not None

    @property
    def steps(self) -> int:
        return self._step

    @property
    def should_stop(self) -> bool:
        """True once on_limit="stop" decided to end the run (loops: `if doctor.should_stop: break`)."""
        return self._limit_watch.should_stop

    @property
    def readings(self) -> dict[str, float]:
        """The latest value of every series, e.g. for a framework logger."""
        with self._lock:
            return {name: s.end for name, s in self._monitor.series.items() if s.end is not None}

    @property
    def active_remedies(self) -> list[Remedy]:
        """Remedies currently applied (being verified, or verified effective)."""
        return [t.remedy for t in self._clinic.treatments]

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on from this one (for checkpoints): the step count, findings and
        notes. The series stay with this process."""
        with self._lock:
            return {"schema": STATE_SCHEMA, "steps": self._step,
                    "findings": [f.to_dict() for f in self._clinic.findings], "notes": list(self._clinic.notes)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from a `state_dict()`; call it before the first step. Steps count on from the saved ones,
        and a new warm-up follows them, since this process's memory starts afresh."""
        if self._step:
            raise RuntimeError(f"load_state_dict: call it before the first step (this doctor is at step {self._step})")
        if not isinstance(state, Mapping) or state.get("schema") != STATE_SCHEMA:
            raise ValueError(f"load_state_dict: expected a dict from LeakDoctor.state_dict() (schema {STATE_SCHEMA!r})")
        self._step = self._sampler.sampled_step = int(state["steps"])
        self._clinic.restore([Finding.from_dict(f) for f in state["findings"]], list(state["notes"]))
        self.settings = dataclasses.replace(self.settings, warmup=self.settings.warmup + self._step)
        self._monitor.settings = self._clinic.settings = self._sampler.settings = self.settings

    def __enter__(self) -> "LeakDoctor":
        self._sampler.restart()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.finish(exc)
        return False

    def _publish(self, final: Summary | None = None) -> None:
        """Hand the exporter what this sample left (readings, findings, projection, overhead, the verdict
        so far), or at finish() the `final` summary's values."""
        if final is not None:
            self._publisher.publish(final.steps, self.readings, final.findings, final.projected_limit_step,
                                    final.overhead, final.verdict)
            return
        findings = self._clinic.findings
        verdict = verdict_of(findings)
        if verdict == "clean" and report.unwatched(self.settings, self._step, self._guard.engine_error()):
            verdict = "unwatched"
        self._publisher.publish(self._step, self.readings, findings,
                                report.projection(findings, self._monitor, self._step), self._overhead(), verdict)

    # --- the end ---------------------------------------------------------------------------------

    def _build_summary(self) -> Summary:
        findings = report.final_findings(self._clinic.findings, self._monitor, self.settings)
        first = min(report.projections(findings, self._monitor, self._step), key=lambda p: p.step, default=None)
        return Summary(
            framework=self.framework,
            steps=self._step,
            series={name: report.series_summary(self._monitor, name, self.settings) for name in self._monitor.series},
            findings=findings,
            projected_limit_step=first.step if first else None,
            overhead=self._overhead(),
            notes=unique(self._clinic.notes + report.skipped_notes(self._monitor)),
            errors=list(self._guard.errors),
            rank=self.settings.rank,
            version=__version__,
            settings=report.settings_record(self.settings, self._sampler.pacer.every),
            memory_limit=self._limit_of(first.metric if first else "rss_bytes"),
            stopped=self._limit_watch.stopped,
            stopped_by=self._limit_watch.stopped_by,
            unwatched=report.unwatched(self.settings, self._step, self._guard.engine_error()),
        )

    def _bare_summary(self) -> Summary:
        return Summary(self.framework, self._step, {}, list(self._clinic.findings), notes=list(self._clinic.notes),
                       errors=list(self._guard.errors), rank=self.settings.rank, version=__version__,
                       memory_limit=self._memory.record(), stopped=self._limit_watch.stopped,
                       stopped_by=self._limit_watch.stopped_by,
                       unwatched=report.unwatched(self.settings, self._step, self._guard.engine_error()))

    def _limit_of(self, metric: str) -> dict[str, Any] | None:
        """The summary's `memory_limit` entry for a metric: which limit it was held to, and why."""
        series = self._monitor.series.get(metric)
        return limits.describe(series.spec if series else None, self._memory, self.settings.memory_limit)

    def _overhead(self) -> dict[str, float]:
        """The doctor's overhead; in a distributed run, with the stop agreements' count and time (already
        in its total)."""
        overhead = report.overhead(self._sampler, self._clinic, self.settings)
        watch = self._limit_watch
        if isinstance(watch, stopping.SharedLimitWatch):
            overhead.update(stop_agreements=watch.agreements, stop_agreement_seconds=watch.agree_seconds)
        return overhead

    def write_summary(self, summary: Summary | None = None) -> bool:
        """Write `summary` (default: the run so far) to `summary_path` now, atomically, e.g. a callback's
        summary at the end of each fit; True if it was written. A path that fails is reported once and
        not tried again: the final summary then goes to stderr."""
        path = self.settings.summary_path
        if path is None or "summary_path" in self._guard.off:
            return False
        try:
            (summary or self.summary).write(path)
            return True
        except OSError as err:
            self._guard.disable("summary_path", f"cannot write {path}: {err}; the final summary goes to stderr")
            return False

    def _emit(self, summary: Summary) -> None:
        """Write the JSON (stderr if the path fails), the plot, and print the table on rank 0."""
        if self.settings.summary_path is not None and not self.write_summary(summary):
            print(summary.to_json(), file=sys.stderr)
        if self.settings.plot_path is not None:
            self._guard.call("plot", summary.plot, self.settings.plot_path)
        if self.settings.verbose and self.settings.rank == 0:
            print(summary.text(), file=sys.stderr)

    def _say(self, message: str) -> None:
        if self.settings.verbose and self.settings.rank == 0:
            print(f"leakdoctor: {message}", file=sys.stderr)


def _with_errors(summary: Summary, guard: Guard) -> Summary:
    """`summary` with this doctor's errors that came after it was built (the post-mortem, the gathering of
    the ranks' summaries, the push), added after those it holds (a merged summary's, of every rank)."""
    late = [e for e in guard.errors if e not in summary.errors]
    return dataclasses.replace(summary, errors=[*summary.errors, *late]) if late else summary


class _Late:
    """A method of the doctor called through the doctor's state: on a stand-in sharing its __dict__, so
    that the parts that call back (the clinic's messages, the limit watch) do not hold the doctor."""

    __slots__ = ("cls", "state", "name")

    def __init__(self, cls: type, state: dict[str, Any], name: str) -> None:
        self.cls, self.state, self.name = cls, state, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(_stand_in(self.cls, self.state), self.name)(*args, **kwargs)


def _stand_in(cls: type, state: dict[str, Any]) -> Any:
    """A doctor of class `cls` whose attributes are `state` (another doctor's __dict__, shared)."""
    doctor = cls.__new__(cls)
    doctor.__dict__ = state
    return doctor


def _finish_unattended(cls: type, state: dict[str, Any], how: str, exception: BaseException | None = None) -> None:
    """Finish, from its state, a doctor the run never finished: `how` is "exit" (interpreter exit, or the
    end of a multiprocessing child), "collected" (dropped and garbage-collected) or "SIGTERM" (the
    handler's `exception`). Nothing is done for a copy inherited through a fork, nor for a finished one.
    A subclass sees `_unattended` set: it must not wait on other processes then (torch: no collective)."""
    if state.get("_pid") != os.getpid() or state.get("_result") is not None:
        return
    doctor = _stand_in(cls, state)
    doctor._unattended = how
    if exception is None and how == "exit":
        exception = oom.uncaught()
    try:
        doctor.finish(exception)
    except Exception as err:  # noqa: BLE001 - never raise from atexit, a signal handler or a collection
        print(f"leakdoctor: could not finish the doctor ({how}): {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        termination.unregister(doctor)


#: The doctors of this process, for _new_locks_in_child (weak: a dropped doctor is still collected).
_LIVE: "weakref.WeakSet[LeakDoctor]" = weakref.WeakSet()


def _new_locks_in_child() -> None:
    """In a forked child, a fresh lock for every doctor: the fork may have come while the sampler thread
    held the parent's (writing the post-mortem at the memory alarm), and that thread does not exist in
    the child, so the inherited lock would stay held for good and the child's first step() would wait on
    it forever (a DataLoader or multiprocessing worker that steps the inherited doctor)."""
    for doctor in list(_LIVE):
        doctor.__dict__["_lock"] = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


def _child_finalizer(finish: Callable[[], Any]) -> Any:
    """In a multiprocessing child, a finalizer that multiprocessing runs as the child ends (its process
    ends by os._exit, without atexit); None elsewhere."""
    import multiprocessing

    if multiprocessing.parent_process() is None:
        return None
    from multiprocessing import util

    return util.Finalize(None, finish, exitpriority=10)
