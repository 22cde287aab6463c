"""The Keras 3 callback, for every backend (jax, torch; tensorflow where installed):

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    doctor = LeakDoctorCallback(remedies="all", summary_path="leaks.json")
    for units in (32, 64, 128):                               # one instance, reused across calls
        model = build(units)
        model.fit(x, y, epochs=5, callbacks=[doctor, keras.callbacks.CSVLogger("log.csv")])
        model.predict(x_test, callbacks=[doctor])
    summary = doctor.finish()                                 # or doctor.summary, a snapshot

Two clocks, because Keras leaks come at two paces. Across calls (models built in a loop, predict called
in a loop with changing shapes) memory grows by call, and only a clock of calls sees that: a fit of a
thousand batches that leaves one more model behind adds too little per batch to matter, and a window of
a few batches never sees it. So one doctor (`doctor`), kept for the life of the callback, steps once at
the end of every top-level fit/evaluate/predict call, with settings counted in calls (`call_options`):
its series and findings are the callback's one history, and its steps are calls. Within a fit (a layer
keeping tensors, retracing on every batch) memory grows by batch: each fit also gets a doctor of its own,
which steps on every training batch (validation batches are not steps; the step is taken when the next
batch begins, so that Keras keeps running batch-end callbacks off the training thread); its findings
join the history as findings of that call, their rates per call. A fit cannot tell growth that stops
when it ends (the first fit's one-time caches) from a leak: a fit's finding named only by its rate, which
no later fit repeats (LATER_FITS of them watched), is withdrawn, with the reason.

The summary counts in one clock, training batches (on_batches): its steps are the batches of every fit,
each call marked in `calls`; the fits' findings stand at their batches (after those of the fits before),
the across-calls findings at the batches of the calls where they began and were found, with rates per
batch (a call's growth spread over the batches since), and the table is the fits' batch readings with a
reading at the end of each call. A run that trained no batch (predict in a loop) counts its calls.

At each epoch end the fit's latest readings go into `logs` as `<log_prefix>/<metric>`, so CSVLogger,
TensorBoard and History record them: list LeakDoctorCallback before them. At the end of every fit the
cumulative summary is written to `summary_path` (atomically), and one line about the fit is printed if
`verbose` and the fit's own verbose is not 0; the doctor keeps running. `finish()` ends it (so do
interpreter exit, SIGTERM and the callback's collection, through the across-calls doctor's own
lifecycle): the final summary is written, plotted to `plot_path` and printed, once per run. Copies of the callback are the callback itself
(KerasTuner deep-copies callbacks for every trial), so trials share one history too.

With `on_limit="stop"`, when a fit's unremedied leak is projected to reach the memory limit within the
margin, the callback saves the model (`model.save`, a .keras file next to `summary_path`, else in the
working directory), calls `checkpoint=` if given, and sets `model.stop_training`. The across-calls doctor
cannot stop the user's loop of calls: for it "stop" acts as "warn", and the summary's notes say so. Keras
gives callbacks no exception hook: use the callback as a context manager (`with LeakDoctorCallback(...) as
doctor:`), call `finish(exception)`, or let the program end, and an out-of-memory error gets its
post-mortem.

In a multi-process run (the jax backend with jax.distributed initialized and more than one process, or
the torch backend with torch.distributed initialized and more than one rank: make the callback after it)
every process measures itself: `rank` defaults to the process's, and a process > 0 writes its summary
beside the summary path (leaks.json -> leaks.rank1.json, ranks.rank_path), no plot; nothing is gathered.
on_limit="stop" ends every process's fit at the same batch, since a process that left its fit alone would
leave the others waiting in their next collective: the fits' doctors agree as the loop doctors do
(stopping.py: at agreement batches one process_allgather, or all_reduce, of a few integers), and each
file says which process asked (`stopped_by`). Process 0 alone calls `checkpoint=` and saves the model:
Keras's model.save is no collective, and every process would write the same file (under data parallelism
every process holds the same weights). Where the environment says the run has several processes
(WORLD_SIZE, KERAS_DISTRIBUTION_NUM_PROCESSES) but none of these collectives is initialized, "stop" acts
as "warn" within fits too, and the notes say why.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from leakdoctor import doctor
from leakdoctor import _options as doctor_options
from leakdoctor._base import logs
from leakdoctor._base.findings import Finding, SeriesSummary
from leakdoctor._base.guard import Guard
from leakdoctor._base.messages import Record, msg
from leakdoctor._base.trend import theil_sen
from leakdoctor.framework import Ending, Framework
from leakdoctor.integrations import _keras as keras_integration
from leakdoctor._judging.stopped import thinned
from leakdoctor._lifecycle import stopping
from leakdoctor.reporting import _ranks as ranks, _report as report
from leakdoctor.reporting._exporter import Publisher, publisher_for
from leakdoctor.reporting.summary import Summary
from leakdoctor.settings import DoctorOptions, Settings, documented, reject_unknown

__all__ = ["LeakDoctorCallback", "KerasDoctor"]

#: Keras backends an extra of leakdoctor installs, with that extra.
BACKEND_EXTRAS = {"jax": "keras-jax", "torch": "keras-torch"}
KERAS_BACKENDS = ("tensorflow", "jax", "torch", "numpy", "openvino")


def _require_keras() -> Any:
    """The keras module. Keras installed without the backend it is set to (KERAS_BACKEND, else keras.json,
    else tensorflow) fails at its own import with a bare ModuleNotFoundError or ValueError: that becomes an
    ImportError that names the backend and the extras that bring one (`pip install ".[keras-jax]"`)."""
    import importlib.util
    import json
    import os

    try:
        return keras_integration.require()
    except (ImportError, ValueError) as err:
        cause = err.__cause__ if isinstance(err, ImportError) else err
        missing = getattr(cause, "name", None) or ""
        if importlib.util.find_spec("keras") is None or missing.split(".")[0] == "keras" \
                or not isinstance(cause, (ModuleNotFoundError, ValueError)) \
                or (isinstance(cause, ValueError) and "backend" not in str(cause)):
            raise
        home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
        asked, where = os.environ.get("KERAS_BACKEND"), "KERAS_BACKEND"
        if not asked:
            try:
                with open(os.path.join(home, "keras.json")) as file:
                    asked, where = json.load(file).get("backend"), os.path.join(home, "keras.json")
            except (OSError, ValueError, AttributeError):
                asked = None
        asked, where = (asked, where) if asked else ("tensorflow", "Keras's default")
        here = [name for name in BACKEND_EXTRAS if name != asked and name not in sys.modules
                and importlib.util.find_spec(name) is not None]
        extras = " or ".join(f'pip install ".[{extra}]" (then KERAS_BACKEND={name})'
                             for name, extra in BACKEND_EXTRAS.items())
        raise ImportError(
            f"leakdoctor's Keras callback: Keras is installed but cannot import its backend {asked!r} (from "
            f"{where}): {cause}. Install Keras with a backend, from the leakdoctor checkout: {extras}"
            + (f"; or install {asked} itself" if asked in KERAS_BACKENDS else
               f"; {asked!r} is no Keras backend ({', '.join(KERAS_BACKENDS)})") + (f"; or use one installed here: KERAS_BACKEND={here[0]}" if here else "")) from err


if TYPE_CHECKING:
    import keras
    from typing_extensions import Unpack
else:
    keras = _require_keras()  # without Keras 3 or its backend: an ImportError that names the extra

#: The across-calls doctor's settings, in calls: warm-up over the first imports and compiles, one call
#: per window, an investigation over 4 calls, a remedy judged after 6, and growth that matters within
#: 10,000 calls. `call_options=` overrides any of them.
CALL_DEFAULTS: Mapping[str, int] = {"warmup": 3, "window": 1, "investigate_steps": 4, "verify_windows": 6,
                                    "horizon": 10_000}
_KINDS = {"train": "fit", "test": "evaluate", "predict": "predict"}
#: The points a series of the summary keeps (as _reading/series.py's history).
HISTORY = 1024
#: Options for the across-calls doctor alone: it writes, plots and serves the callback's one summary.
_RUN_ONLY = ("summary_path", "plot_path", "html_path", "prometheus_port", "prometheus_host",
             "prometheus_linger", "prometheus_pushgateway", "trackers")


class KerasDoctor(doctor.LeakDoctor):
    """The engine with the Keras integrations, for one of the callback's two clocks. With `record` it is
    the across-calls doctor, which owns the callback's run: its summary is completed with the record into
    the callback's cumulative one, and its own lifecycle writes, plots and prints that once (at finish(),
    at exit, on SIGTERM, when collected). Without, it is a fit's doctor: it neither writes nor prints (its
    findings join the record), and the across-calls doctor finishes it, on SIGTERM too. `label` prefixes
    its messages; forensics named in `without` are left out; `publisher`: a feed of the across-calls
    doctor's /metrics server for this doctor's clock; `agree`: a fit's doctor's collective in a
    multi-process run, so that every process stops at the same batch (None: this process stops alone)."""

    framework = "keras"

    def __init__(self, calls: keras_integration.Calls, label: str, model: Any = None, without: tuple[str, ...] = (),
                 publisher: Publisher | None = None, record: _Record | None = None,
                 agree: stopping.Agree | None = None, offset: int = 0, **options: Any) -> None:
        self.label = label
        self.offset = offset  # a fit's doctor: the training batches before its fit (its live lines count on)
        part = Framework(
            name=type(self).framework,
            integrations=[keras_integration.integration(calls), *keras_integration.backend_integrations(model)],
            leaves_out=without, stop_agreement=lambda: agree, publisher=_feed(publisher),
            words=_Clock(label, offset, record).words)
        super().__init__(part=_across_calls(part, record) if record is not None else _of_a_fit(part), **options)
        if keras_integration.is_users(model):  # a subclassed model's list/dict attributes are counted
            self.watch_object(model)


def _across_calls(part: Framework, record: _Record) -> Framework:
    """The across-calls doctor owns the callback's run: its summary is the callback's cumulative one, which
    it writes while the run goes (heartbeat) and completes at the end (a call still open ends, and every
    fit's findings join the calls' own)."""
    def complete(summary: Summary, ending: Ending) -> Summary:
        record.guard.call("keras callback", record.abandon, ending.steps + 1, ending.exception)
        return record.cumulative(summary)

    return dataclasses.replace(part, complete=complete, interim=record.cumulative)


def _of_a_fit(part: Framework) -> Framework:
    """A fit's doctor neither writes nor prints (its findings join the callback's record), and the
    across-calls doctor finishes it, on SIGTERM too."""
    return dataclasses.replace(part, emits=_never, sigterm="owner")


def _never(summary: Summary, ending: Ending) -> bool:
    return False


def _feed(given: Publisher | None) -> Callable[[Settings, Guard], Publisher | None]:
    """Where a doctor's metrics go: a fit's doctor feeds the across-calls doctor's /metrics server (`given`),
    the across-calls doctor serves its own, its series labelled `clock="call"`."""
    def publisher(settings: Settings, guard: Guard) -> Publisher | None:
        if given is not None:
            return given
        own = publisher_for(settings, KerasDoctor.framework, guard)
        if own is not None:
            own.labels["clock"] = "call"
        return own

    return publisher


@dataclasses.dataclass(frozen=True)
class _Clock:
    """How a Keras doctor says its steps: a fit's doctor on the run's clock of training batches (`offset`
    of them before its fit); the across-calls doctor (with `record`) on its calls, marked."""

    label: str
    offset: int
    record: _Record | None

    def words(self, message: str) -> str:
        """A live line on the run's one clock, training batches: 'step 64: ...' of a fit's doctor is its
        batch plus the batches before its fit; of the across-calls doctor, the batches at the end of that
        call, with the call marked ('step 480 (call 3): ...'). A run that trained no batch counts calls.
        An alert stays one (logs.retell), in these words."""
        return logs.retell(message, f"{self.label}, {self._on_batches(message)}")

    def _on_batches(self, message: str) -> str:
        head, colon, rest = message.partition(": ")
        number = head.removeprefix("step ")
        if not colon or not head.startswith("step ") or not number.isdigit():
            return message
        if self.record is None:
            return f"step {self.offset + int(number)}: {rest}"
        if not self.record.batches:
            return message
        return f"step {self.record.at(int(number))} (call {number}): {rest}"


#: The overhead parts that add up across the doctors of a run's calls and fits.
COST_PARTS = ("probe_seconds", "thread_cpu_seconds", "forensic_seconds", "investigations", "suspicions_triaged",
              "investigations_deferred", "run_seconds")


def with_fits_cost(calls: dict[str, Any], cost: dict[str, float]) -> dict[str, Any]:
    """The across-calls doctor's overhead with its fits' doctors' cost added, so that the printed total is the
    sum of every doctor's parts. The run's time is the longer of the calls doctor's (from the end of the first
    call: a fit is one of its steps) and the fits' together (their batches)."""
    total = cost["probe_seconds"] + cost["thread_cpu_seconds"] + cost["forensic_seconds"]
    run = max(float(calls.get("run_seconds") or 0.0), cost["run_seconds"] - float(calls.get("run_seconds") or 0.0))
    steps = calls.get("step_seconds") or 0.0
    return {**calls, **cost, "run_seconds": run, "investigations": int(cost["investigations"]),
            "suspicions_triaged": int(cost["suspicions_triaged"]),
            "investigations_deferred": int(cost["investigations_deferred"]),
            "total_seconds": total, "fraction_of_run_time": total / run if run else 0.0,
            "fraction_of_step_time": cost["probe_seconds"] / steps if steps else 0.0}


@dataclasses.dataclass
class _Fit:
    """One fit call, the doctor of its batches while it runs, and what the cumulative summary keeps of it
    once it ended (its findings on the clock of calls, notes, errors and probe time; not its series)."""

    number: int
    doctor: KerasDoctor | None
    offset: int = 0  # the training batches of the run before this fit: its batch b is the run's step offset + b
    pending: bool = False  # a batch began and its step is not taken yet
    findings: list[Finding] = dataclasses.field(default_factory=list)
    notes: list[Record] = dataclasses.field(default_factory=list)
    errors: list[dict[str, str]] = dataclasses.field(default_factory=list)
    cost: dict[str, float] = dataclasses.field(default_factory=dict)  # its doctor's additive overhead parts
    stopped: dict[str, Any] | None = None
    stopped_by: dict[str, Any] | None = None
    oom: dict[str, Any] | None = None
    series: dict[str, SeriesSummary] = dataclasses.field(default_factory=dict)  # its batches' (the table's)
    warmup: int = 0  # its doctor's warm-up, in batches

    @classmethod
    def ended(cls, number: int, label: str, summary: Summary, offset: int) -> "_Fit":
        return cls(number, None, offset,
                   findings=[per_batch(f, number, offset, summary.steps, label) for f in summary.findings],
                   notes=[msg("in_fit", label=label, note=note) for note in summary.notes],
                   errors=[{**e, "part": f"{label}: {e['part']}"} for e in summary.errors],
                   cost={part: float(summary.overhead.get(part) or 0.0) for part in COST_PARTS},
                   stopped=summary.stopped and {**summary.stopped, "step": offset + summary.stopped["step"],
                                                "call": number, "batch": summary.stopped["step"],
                                                "reason": f"{label}: {summary.stopped['reason']}"},
                   stopped_by=summary.stopped_by and on_calls(summary.stopped_by, number, offset, label),
                   oom=summary.oom and {**summary.oom, "step": offset + summary.oom["step"], "call": number,
                                        "batch": summary.oom["step"]},
                   series={name: dataclasses.replace(s, points=[(offset + step, v) for step, v in s.points])
                           for name, s in summary.series.items()} if summary.steps else {},
                   warmup=int(summary.settings.get("warmup") or 0))

    def take_step(self) -> bool:
        """The pending batch's step, if one is pending; True when the fit's doctor wants the fit stopped."""
        if not self.pending or self.doctor is None:
            return False
        self.pending = False
        self.doctor.step()
        return self.doctor.should_stop


@dataclasses.dataclass(eq=False)
class _Record:
    """What the callback knows beyond its across-calls doctor's series: the calls open now, the fit that
    runs and the fits that left something (findings, notes, errors), and counts. The callback and that
    doctor share it; it holds neither, so the doctor's exit and SIGTERM handlers keep no callback alive."""

    calls: keras_integration.Calls
    guard: Guard
    fit: _Fit | None = None
    fits: list[_Fit] = dataclasses.field(default_factory=list)
    open: list[str] = dataclasses.field(default_factory=list)
    notes: list[Record] = dataclasses.field(default_factory=list)
    batches: int = 0
    watched: list[int] = dataclasses.field(default_factory=list)  # fits whose batches were watched for a verdict
    fit_cost: dict[str, float] = dataclasses.field(default_factory=dict)  # the ended fits' doctors' cost
    #: per call that ended (the across-calls doctor's steps): its kind, and the training batches at its end
    kinds: list[str] = dataclasses.field(default_factory=list)
    ends: list[int] = dataclasses.field(default_factory=list)

    def call_ended(self, kind: str) -> None:
        """Mark a call's end on the clock of batches (before the across-calls doctor steps for it)."""
        self.kinds.append(kind)
        self.ends.append(self.batches)

    def at(self, call: int) -> int:
        """The run's step (training batches so far) at the end of call `call` (1-based)."""
        if call < 1 or not self.ends:
            return 0
        return self.ends[min(call, len(self.ends)) - 1] if call <= len(self.ends) else self.batches

    def marks(self) -> list[dict[str, Any]]:
        """Each call that ended, on the clock of batches: {"call", "kind", "first_step", "last_step"}."""
        return [{"call": n, "kind": kind, "first_step": min(self.at(n - 1) + 1, self.at(n)), "last_step": self.at(n)}
                for n, kind in enumerate(self.kinds, 1)]

    def end_fit(self, exception: BaseException | None = None) -> Summary | None:
        """Finish the current fit's doctor, keep what the cumulative summary needs of it, and return its
        summary (None when no fit runs)."""
        fit, self.fit = self.fit, None
        if fit is None or fit.doctor is None:
            return None
        fit.take_step()
        batches = fit.doctor.finish(exception)
        if batches.unwatched is None:
            self.watched.append(fit.number)
        ended = _Fit.ended(fit.number, fit.doctor.label, batches, fit.offset)
        for part, value in ended.cost.items():
            self.fit_cost[part] = self.fit_cost.get(part, 0.0) + value
        self.fits.append(dataclasses.replace(ended, cost={}))  # counted once, in fit_cost
        return batches

    def abandon(self, call: int, exception: BaseException | None = None) -> None:
        """A call (number `call`) that began and never ended (it raised, or was interrupted): note it, end
        its fit doctor."""
        if self.open:
            self.notes.append(msg("call_did_not_return", call=call, kind=_KINDS[self.open[0]], site=self.calls.site))
            self.open.clear()
            self.end_fit(exception)

    def cumulative(self, calls: Summary) -> Summary:
        """The across-calls summary `calls` on the run's one clock, with the findings of every fit's batches:
        where the run trained, its steps are the training batches of every fit (the calls marked in `calls`;
        the across-calls series, findings and projection mapped onto them, rates per batch), else its calls."""
        running = self.fit
        batches = running.doctor.summary if running and running.doctor else None
        now = [_Fit.ended(running.number, running.doctor.label, batches, running.offset)] if running and batches else []
        if self.batches:
            calls = on_batches(calls, self, self.fits + now)
        findings = list(calls.findings)
        keys = {f.key for f in findings}
        notes = list(calls.notes) + self.notes
        errors = list(calls.errors) + [{"part": "callback " + e["part"], "error": e["error"]} for e in self.guard.errors]
        cost = {part: float(calls.overhead.get(part) or 0.0) + self.fit_cost.get(part, 0.0) for part in COST_PARTS}
        for fit in self.fits + now:
            for finding in fit.findings:
                if finding.key not in keys:
                    keys.add(finding.key)
                    findings.append(unrepeated(finding, fit.number, self.fits + now, self.watched))
            notes += fit.notes
            errors += fit.errors
            for part, value in fit.cost.items():
                cost[part] += value
        overhead = with_fits_cost(calls.overhead, cost)
        if self.batches:
            notes.insert(0, msg("steps_are_batches", calls=len(self.ends), batches=self.batches))
        else:
            notes.insert(0, msg("steps_are_calls", calls=calls.steps, batches=self.batches))
        fits = self.fits + now
        ender = next((fit for fit in fits if fit.stopped), None)
        stopped, by = (ender.stopped, ender.stopped_by) if ender else (calls.stopped, calls.stopped_by)
        died = next((fit.oom for fit in reversed(fits) if fit.oom), calls.oom)
        watched = bool(self.watched) or (batches is not None and batches.unwatched is None)
        return dataclasses.replace(calls, findings=findings, notes=notes, errors=errors, overhead=overhead,
                                   stopped=stopped, stopped_by=by, oom=died,
                                   unwatched=None if watched else calls.unwatched)


@documented
class LeakDoctorCallback(keras.callbacks.Callback):
    """A Keras callback that watches memory across fit/evaluate/predict calls and within each fit, names
    leaks, remedies them when allowed (`remedies=`) and writes one summary for the run (see the module's
    docstring for the two clocks). One instance may be reused across many calls; copies are the instance.

    The summary is printed once per run, at `finish()` (or at interpreter exit, on SIGTERM, or when the
    callback is dropped); at the end of each fit, a one-line account of the fit (when the fit's own
    `verbose` is not 0) and the cumulative summary is written to `summary_path`.

    Args:
        log_prefix: the prefix of the readings added to the epoch's `logs` (`leakdoctor/rss_bytes`).
        call_options: the across-calls doctor's settings, counted in calls (`CALL_DEFAULTS`: warmup,
            window, investigate_steps, verify_windows, horizon); None: the defaults.
        **options: the shared options, below (README "Options"); `warmup`, `window` and the like count
            the batches of each fit. `on_limit="stop"` stops the fit (after saving the model); in a
            multi-process run every process's fit at the same batch, and `rank` defaults to the process's.

    Raises:
        UnknownOptionError: an argument, option or `call_options` name it does not take, with the
            nearest valid one (a ValueError and a TypeError both).
        ValueError: a bad value, named with the valid ones.
        ImportError: at import of this module, when Keras 3 is not installed.

    Example:
        >>> from leakdoctor.callbacks.keras import LeakDoctorCallback
        >>> doctor = LeakDoctorCallback(remedies="all", summary_path="leaks.json")  # doctest: +SKIP
        >>> for units in (32, 64, 128):  # doctest: +SKIP
        ...     build(units).fit(x, y, epochs=5, callbacks=[doctor])
        >>> doctor.finish().verdict  # doctest: +SKIP
        'remedied'
    """

    def __init__(self, *, log_prefix: str = "leakdoctor", call_options: Mapping[str, Any] | None = None,
                 **options: Unpack[DoctorOptions]) -> None:
        super().__init__()
        if not isinstance(log_prefix, str) or not log_prefix:
            raise ValueError(f"log_prefix={log_prefix!r}: expected a non-empty string such as 'leakdoctor'")
        if call_options is not None and not isinstance(call_options, Mapping):
            raise ValueError(f"call_options={call_options!r}: expected a dict of settings such as {dict(CALL_DEFAULTS)}")
        reject_unknown("LeakDoctorCallback(call_options=...)", call_options or {}, CALL_DEFAULTS)
        doctor_options.check(type(self), options)  # bad names and values fail here, not at the first fit
        options, self._agree, notes = _in_processes(options)
        self.settings = doctor_options.check(type(self), options)
        across = {**options, **CALL_DEFAULTS, **(call_options or {})}
        if across.get("on_limit") == "stop":  # a callback cannot stop the loop of calls
            across.update(on_limit="warn", checkpoint=None)
        doctor_options.check(type(self), across)
        self.log_prefix = log_prefix
        self._fit_options = {k: v for k, v in options.items() if k not in _RUN_ONLY}
        self._record = _Record(keras_integration.Calls(), Guard(), notes=notes)
        # No tracemalloc across calls: a trace of whole calls leaves the heap fragmented, and resident
        # memory steps up by megabytes for good (measured with JAX), which this doctor would then see as
        # growth. The models probe and the gc census name what piles up across calls instead.
        self.doctor = KerasDoctor(self._record.calls, "across calls", without=("tracemalloc",), record=self._record,
                                  **across)
        self._fit_publisher = self.doctor.metrics_feed(clock="batch")  # each fit's doctor feeds its /metrics

    # --- what users call -----------------------------------------------------------------------------

    @property
    def summary(self) -> Summary:
        """The cumulative summary: final after `finish()`, else a snapshot of every call so far (0 steps
        and verdict "unwatched" before the first call)."""
        return self.doctor.summary if self.doctor.finished else self._record.cumulative(self.doctor.summary)

    def finish(self, exception: BaseException | None = None) -> Summary:
        """End the run: conclude what is pending, write, plot and print the final summary, once. Safe to
        call more than once; the instance ignores later calls. `exception`: what ended the run, if
        anything (an out-of-memory error gets its post-mortem)."""
        return self.doctor.finish(exception)

    def __copy__(self) -> "LeakDoctorCallback":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "LeakDoctorCallback":
        """The instance itself: KerasTuner deep-copies the callbacks of every trial, and a copy would split
        the one history that makes growth across trials visible."""
        return self

    def __enter__(self) -> "LeakDoctorCallback":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.finish(exc)
        return False

    # --- Keras hooks ---------------------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        self._record.guard.call("keras callback", self._begin, "train")

    def on_test_begin(self, logs: Any = None) -> None:
        self._record.guard.call("keras callback", self._begin, "test")

    def on_predict_begin(self, logs: Any = None) -> None:
        self._record.guard.call("keras callback", self._begin, "predict")

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        """The step of the previous batch ends here. Stepping at a batch's begin rather than its end keeps
        Keras's batch-end callbacks asynchronous (it runs them in a thread pool unless a callback overrides
        a batch-end hook), and with them the loss's copy to the host off the training thread."""
        record = self._record
        if record.fit is not None and len(record.open) == 1:
            self._step_batch(record.fit)
            record.fit.pending = True
            record.batches += 1

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        fit = self._record.fit
        if fit is None:
            return
        self._step_batch(fit)  # the epoch's last batch
        if isinstance(logs, dict):
            readings = self._record.guard.call("keras callback", lambda: fit.doctor.readings, default={})
            logs.update({f"{self.log_prefix}/{name}": value for name, value in readings.items()
                         if not name.startswith("len(")})  # container sizes stay in the summary

    def on_train_end(self, logs: Any = None) -> None:
        self._record.guard.call("keras callback", self._end, "train")

    def on_test_end(self, logs: Any = None) -> None:
        self._record.guard.call("keras callback", self._end, "test")

    def on_predict_end(self, logs: Any = None) -> None:
        self._record.guard.call("keras callback", self._end, "predict")

    # --- calls -------------------------------------------------------------------------------------

    def _begin(self, kind: str) -> None:
        record = self._record
        if self.doctor.finished:
            return
        if record.open and (kind == "train" or record.open[0] != "train"):  # the previous call raised
            record.abandon(self.doctor.steps + 1)
        record.open.append(kind)
        if len(record.open) > 1:  # validation inside fit, or a call from a callback: part of the call
            return
        site = keras_integration.caller_site()
        record.calls.begin(_KINDS[kind], self._model, site)
        if kind == "train":
            number = self.doctor.steps + 1
            label = f"fit() call {number}" + (f" at {site}" if site else "")
            options = {**self._fit_options, "oom_snapshot": None}  # the across-calls doctor records it
            if options.get("on_limit") == "stop":
                options["checkpoint"] = self._saver(number, options.get("checkpoint"))
            record.fit = _Fit(number, KerasDoctor(record.calls, label, self._model, publisher=self._fit_publisher,
                                                  agree=self._agree, offset=record.batches, **options),
                              offset=record.batches)

    def _end(self, kind: str) -> None:
        record = self._record
        if self.doctor.finished or not record.open or record.open[-1] != kind:
            return
        record.open.pop()
        if record.open:
            return
        label = record.fit.doctor.label if record.fit and record.fit.doctor else ""
        batches = record.end_fit()
        record.calls.end(self._model)
        record.call_ended(_KINDS[kind])
        self.doctor.step()
        self._model = None  # the callback keeps no model alive between calls
        if kind != "train":
            return
        if self.settings.summary_path is not None:
            self.doctor.write_summary(self.summary)
        shown = self.settings.verbose and self.settings.rank == 0 and (self.params or {}).get("verbose", 1) != 0
        if shown and batches is not None:
            print(fit_line(label, batches), file=sys.stderr)

    def _step_batch(self, fit: _Fit) -> None:
        if fit.take_step() and self._model is not None:
            self._model.stop_training = True

    def _saver(self, number: int, user: Callable[[], Any] | None) -> Callable[[], str]:
        """The checkpoint on_limit="stop" takes in fit `number`: the user's `checkpoint=` (guarded), then the
        model, saved as a .keras file next to the summary (else in the working directory)."""
        def save() -> str:
            if user is not None:
                self._record.guard.call("checkpoint", user)
            folder = self.settings.summary_path.parent if self.settings.summary_path else Path.cwd()
            fit = self._record.fit
            batch = fit.doctor.steps if fit and fit.doctor else self._record.batches
            path = folder / f"leakdoctor-stop-fit{number}-batch{batch}.keras"
            self.model.save(path)  # `model`, not `_model`: on JAX it syncs the state of the running fit first
            return str(path)

        return save


def _in_processes(options: dict[str, Any]) -> tuple[dict[str, Any], stopping.Agree | None, list[str]]:
    """The callback's options in this process, how its fits' doctors agree with the other processes on a
    stop (None: each stops alone), and the notes its summary starts with. In a multi-process run with the
    backend's collective (keras_integration.collective) `rank` defaults to this process's, and a process > 0
    writes its summary beside the summary path (leaks.json -> leaks.rank1.json, ranks.rank_path), no plot.
    In one the environment says has several processes but with no collective, on_limit="stop" acts as
    "warn" within fits too: a process that left its fit alone would leave the others waiting for it in
    their next collective. Across calls "stop" always acts as "warn": a callback cannot end the user's loop
    of calls. Either is said in the notes when the user asked for "stop"."""
    notes: list[Record] = []
    shared = keras_integration.collective()
    options = ranks.options_on_rank(options, shared[0]) if shared is not None else dict(options)
    if options.get("on_limit") != "stop":
        return options, None, notes
    launched = keras_integration.launched_processes() if shared is None else None
    if launched:
        backend = keras_integration.backend()
        start = {"jax": "jax.distributed.initialize()", "torch": "torch.distributed.init_process_group()"}.get(backend)
        fix = msg("init_collective", start=start) if start else msg("no_collective", backend=backend)
        options.update(on_limit="warn", checkpoint=None)
        notes.append(msg("stop_warns_in_fits", variable=launched, fix=fix))
    else:
        notes.append(msg("stop_warns_across_calls"))
    return options, shared[1] if shared is not None else None, notes


def fit_line(label: str, batches: Summary) -> str:
    """The one line printed at the end of a fit: its batches and what they showed (the summary itself
    is printed once, at the end of the run)."""
    found = "; ".join(f"{f.cause} on {f.metric} ({f.state})" for f in batches.findings) or "nothing found"
    return f"leakdoctor: {label}: {_count(batches.steps, 'training batch')}, {batches.verdict}: {found}"


def on_calls(by: dict[str, Any], call: int, offset: int, label: str) -> dict[str, Any]:
    """A fit's `stopped_by` on the run's clock, as its `stopped`: the step (the batches before the fit plus
    the fit's batch), the call, and the batch the process asked at (None where this process does not know
    it: another asked)."""
    asked = by.get("step") is not None
    return {**by, "step": offset + by["step"] if asked else None, "call": call, "batch": by.get("step"),
            "reason": f"{label}: {by['reason']}" if by.get("reason") else by.get("reason")}


def per_batch(finding: Finding, call: int, offset: int, batches: int, label: str) -> Finding:
    """A finding of one fit's batches on the run's clock of training batches: its steps moved on by the
    batches before the fit (`offset`), its rates per batch as they are, the call named in the evidence."""
    remedy = finding.remedy and dataclasses.replace(finding.remedy, applied_step=offset + finding.remedy.applied_step)
    proof = [{**p, "points": [[offset + step, value] for step, value in p.get("points", [])]} for p in finding.proof]
    return dataclasses.replace(
        finding, first_step=offset + finding.first_step, detected_step=offset + finding.detected_step, remedy=remedy,
        proof=proof,
        evidence=msg("within_fit", label=label, batches=batches, first=offset + 1, last=offset + batches,
                     batch=finding.first_step, evidence=finding.evidence))


def on_batches(calls: Summary, record: _Record, fits: list[_Fit]) -> Summary:
    """The across-calls doctor's summary on the clock of training batches: its steps the run's batches, each
    call marked (`calls`); its series' readings (one at the end of each call) at the batches then, their
    slopes per batch; its findings from the first batch of the call where the growth began, at the batches
    where it was found, their rates per batch (a call's growth over the batches of the calls since, so that
    a rate times the steps is the growth the table shows); the projected limit step likewise."""
    whole = len(record.ends) / record.batches  # calls per batch over the run

    def per(since_call: int) -> float:
        batches = record.batches - record.at(since_call - 1)
        return (len(record.ends) - since_call + 1) / batches if batches > 0 and since_call >= 1 else whole

    def scaled(rate: float | None, factor: float) -> float | None:
        return None if rate is None else rate * factor

    series = {name: dataclasses.replace(s, slope_per_step=s.slope_per_step * whole,
                                        points=[(record.at(step), value) for step, value in s.points])
              for name, s in calls.series.items()}
    judged_on_calls = len(record.ends) >= CALLS_JUDGED
    for name in dict.fromkeys([*series, *(n for fit in fits for n in fit.series)]):
        having = [fit for fit in fits if name in fit.series]
        since = having[0].offset + having[0].warmup if having else 0
        series[name] = _one_series(series.get(name), [fit.series[name] for fit in having], since, judged_on_calls)
    findings = []
    for f in calls.findings:
        factor = per(f.first_step)
        remedy = f.remedy and dataclasses.replace(f.remedy, applied_step=record.at(f.remedy.applied_step),
                                                  rate_after=scaled(f.remedy.rate_after, per(f.remedy.applied_step)))
        findings.append(dataclasses.replace(
            f, first_step=record.at(f.first_step - 1) + 1, detected_step=record.at(f.detected_step),
            rate_per_step=f.rate_per_step * factor, detected_rate=scaled(f.detected_rate, factor),
            rate_interval=f.rate_interval and (f.rate_interval[0] * factor, f.rate_interval[1] * factor),
            proof=[{**p, "points": [[record.at(step), value] for step, value in p.get("points", [])]} for p in f.proof],
            supporting=[{**o, "rate_per_step": scaled(o.get("rate_per_step"), factor),
                         "first_step": record.at(o["first_step"] - 1) + 1 if o.get("first_step") else o.get("first_step"),
                         "detected_step": record.at(o["detected_step"]) if o.get("detected_step") else o.get("detected_step")}
                        for o in f.supporting],
            remedy=remedy))
    projected = calls.projected_limit_step
    if projected is not None:
        projected = record.batches + round((projected - len(record.ends)) / whole)
    oom = calls.oom and {**calls.oom, "step": record.at(calls.oom["step"]), "call": calls.oom["step"]} \
        if calls.oom and isinstance(calls.oom.get("step"), int) else calls.oom
    return dataclasses.replace(calls, steps=record.batches, series=series, findings=findings,
                               projected_limit_step=projected, oom=oom, calls=record.marks())


#: Calls from which the across-calls series judge a trend (its warm-up and two windows of CALL_DEFAULTS);
#: before, the trend of the table is the longest fit's, over its batches.
CALLS_JUDGED = 6


def _one_series(calls: SeriesSummary | None, fits: list[SeriesSummary], since: int,
                judged_on_calls: bool) -> SeriesSummary:
    """One metric on the clock of batches: every fit's batch readings and the readings at each call's end,
    in step order (at most 1024 points, evenly decimated); from the first fit's first reading after its
    warm-up (`since`: the step it ends at; else the calls'), to the last; the slope per batch over the
    readings after it (a Theil–Sen fit
    of at most FIT_POINTS); the trend of the calls once they are enough to judge one, else the longest fit's.
    A time per step is the fits' alone (a call's time is not a batch's)."""
    timed = calls is not None and calls.unit == "seconds" and fits  # a call's time is no batch's: not mixed
    parts = [*fits, *([calls] if calls is not None and not timed else [])]
    points = sorted({step: value for part in parts for step, value in part.points}.items())
    if len(points) > HISTORY:
        points = points[::math.ceil(len(points) / HISTORY)] + [points[-1]]
    base = fits[0] if fits else calls
    assert base is not None
    steps = np.asarray([p for p, _ in points if p > since], dtype=float)
    values = np.asarray([v for p, v in points if p > since], dtype=float)
    slope = theil_sen(*thinned(steps, values))[0] if len(values) >= 2 else 0.0
    judge = calls if judged_on_calls and calls is not None and not timed else \
        max(fits, key=lambda f: len(f.points)) if fits else calls
    assert judge is not None
    return SeriesSummary(base.unit, base.start, points[-1][1] if points else base.end,
                         max(part.peak for part in parts), float(slope), judge.trend, [tuple(p) for p in points],
                         judge.slow)


#: Later fits, watched, that must not show a growth found within one fit for it to be that fit's alone.
LATER_FITS = 2


def unrepeated(finding: Finding, number: int, fits: list[_Fit], watched: list[int]) -> Finding:
    """A fit's leak that no later fit repeated, withdrawn with the reason: growth that the evidence names
    only by its rate (native memory, Python objects; not a proven cause) found within fit `number`, where
    at least LATER_FITS later fits were watched and none found the same cause on the same metric. A fit
    sees its batches alone and cannot tell a growth that stops after it (the first fit's one-time native
    caches: a backend's kernel and primitive caches filling) from one that goes on; the later fits can,
    as they train the same way. Else the finding as it is."""
    later = [n for n in watched if n > number]
    if finding.final_state != "leak" or report.proven(finding) or len(later) < LATER_FITS:
        return finding
    if any((f.cause, f.metric) == (finding.cause, finding.metric)
           for fit in fits if fit.number > number for f in fit.findings):
        return finding
    return dataclasses.replace(
        finding, state="withdrawn", severity=None,
        reason=msg("grew_in_one_fit", metric=finding.metric, number=number, later=len(later)))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")
