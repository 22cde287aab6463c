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
join the history as findings of that call, their rates per call.

At each epoch end the fit's latest readings go into `logs` as `<log_prefix>/<metric>`, so CSVLogger,
TensorBoard and History record them: list LeakDoctorCallback before them. At the end of every fit the
cumulative summary is written to `summary_path` (atomically) and printed if `verbose` and the fit's own
verbose is not 0; the doctor keeps running. `finish()` (or interpreter exit) ends it: the final summary
is written, plotted to `plot_path` and printed. Copies of the callback are the callback itself
(KerasTuner deep-copies callbacks for every trial), so trials share one history too.

With `on_limit="stop"`, when a fit's unremedied leak is projected to reach the memory limit within the
margin, the callback saves the model (`model.save`, a .keras file next to `summary_path`, else in the
working directory), calls `checkpoint=` if given, and sets `model.stop_training`. The across-calls doctor
cannot stop the user's loop of calls: for it "stop" acts as "warn". Keras gives callbacks no exception
hook: use the callback as a context manager (`with LeakDoctorCallback(...) as doctor:`), call
`finish(exception)`, or let the program end, and an out-of-memory error gets its post-mortem.
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from leakdoctor import doctor, oom, termination
from leakdoctor import options as doctor_options
from leakdoctor.exporter import Publisher
from leakdoctor.guard import Guard
from leakdoctor.integrations import Integration
from leakdoctor.integrations import keras as keras_integration
from leakdoctor.summary import Finding, Summary, format_value

#: The across-calls doctor's settings, in calls: warm-up over the first imports and compiles, one call
#: per window, an investigation over 4 calls, a remedy judged after 6, and growth that matters within
#: 10,000 calls. `call_options=` overrides any of them.
CALL_DEFAULTS: Mapping[str, int] = {"warmup": 3, "window": 1, "investigate_steps": 4, "verify_windows": 6,
                                    "horizon": 10_000}
_KINDS = {"train": "fit", "test": "evaluate", "predict": "predict"}


class KerasDoctor(doctor.LeakDoctor):
    """The engine with the Keras integrations; it neither writes nor prints its own summary (the callback
    writes one summary of both clocks). `label` prefixes its messages; forensics named in `without` are
    left out. `publisher`: the callback's Prometheus feed for this doctor's clock (the across-calls
    doctor, which serves it, labels its own `clock="call"`)."""

    framework = "keras"

    def __init__(self, calls: keras_integration.Calls, label: str, model: Any = None, without: tuple[str, ...] = (),
                 publisher: Publisher | None = None, **options: Any) -> None:
        parts: list[Integration] = [keras_integration.integration(calls),
                                    *keras_integration.backend_integrations(model)]
        self.label = label
        super().__init__(integrations=[*parts, *options.pop("integrations", ())], **options)
        practice = self._clinic.practice
        practice.forensics = [f for f in practice.forensics if f.name not in without]
        if keras_integration.is_users(model):  # a subclassed model's list/dict attributes are counted
            self.watch_object(model)
        termination.unregister(self)  # the callback finishes it, on SIGTERM too
        if publisher is not None:
            self._publisher = publisher
        elif self._publisher is not None:
            self._publisher.labels["clock"] = "call"

    def _emit(self, summary: Summary) -> None:
        pass

    def _say(self, message: str) -> None:
        super()._say(f"{self.label}, {message}")


@dataclasses.dataclass
class _Fit:
    """One fit call, the doctor of its batches while it runs, and what the cumulative summary keeps of it
    once it ended (its findings on the clock of calls, notes, errors and probe time; not its series)."""

    number: int
    doctor: KerasDoctor | None
    pending: bool = False  # a batch began and its step is not taken yet
    findings: list[Finding] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    errors: list[dict[str, str]] = dataclasses.field(default_factory=list)
    probe_seconds: float = 0.0
    stopped: dict[str, Any] | None = None
    oom: dict[str, Any] | None = None

    @classmethod
    def ended(cls, number: int, label: str, summary: Summary) -> "_Fit":
        return cls(number, None, findings=[per_call(f, number, summary.steps, label) for f in summary.findings],
                   notes=[f"{label}: {note}" for note in summary.notes],
                   errors=[{**e, "part": f"{label}: {e['part']}"} for e in summary.errors],
                   probe_seconds=summary.overhead.get("probe_seconds", 0.0),
                   stopped=summary.stopped and {**summary.stopped, "step": number, "batch": summary.stopped["step"],
                                                "reason": f"{label}: {summary.stopped['reason']}"},
                   oom=summary.oom and {**summary.oom, "step": number, "batch": summary.oom["step"]})


class _Hooks:
    """What LeakDoctorCallback does; the class itself adds keras.callbacks.Callback as its base."""

    def __init__(self, *, remedies: Any = "off", summary_path: Any = None, plot_path: Any = None,
                 verbose: bool = True, log_prefix: str = "leakdoctor", call_options: Mapping[str, Any] | None = None,
                 **options: Any) -> None:
        super().__init__()
        keras_integration.require()
        if not isinstance(log_prefix, str) or not log_prefix:
            raise ValueError(f"log_prefix={log_prefix!r}: expected a non-empty string such as 'leakdoctor'")
        if call_options is not None and not isinstance(call_options, Mapping):
            raise ValueError(f"call_options={call_options!r}: expected a dict of settings such as {dict(CALL_DEFAULTS)}")
        unknown = sorted(set(call_options or {}) - set(CALL_DEFAULTS))
        if unknown:
            raise ValueError(f"call_options: unknown setting(s) {unknown}: valid ones are {sorted(CALL_DEFAULTS)}")
        self._batch_options = dict(remedies=remedies, verbose=verbose, **options)
        self._call_options = {**self._batch_options, **CALL_DEFAULTS, **(call_options or {})}
        if self._call_options.get("on_limit") == "stop":  # a callback cannot stop the loop of calls
            self._call_options.update(on_limit="warn", checkpoint=None)
        # bad names and values fail here, not at the first fit
        settings = doctor_options.check("LeakDoctorCallback", dict(summary_path=summary_path, plot_path=plot_path,
                                                                   **self._batch_options),
                                        own=("log_prefix", "call_options"))
        doctor_options.check("LeakDoctorCallback", self._call_options)
        self.settings = settings
        self.log_prefix = log_prefix
        self._guard = Guard()
        self._calls = keras_integration.Calls()
        self._fit: _Fit | None = None
        self._fits: list[_Fit] = []
        self._fit_probe_seconds = 0.0
        self._watched_fits = 0  # fits whose batches were watched long enough for a verdict
        self._open: list[str] = []
        self._notes: list[str] = []
        self._batches = 0
        self._result: Summary | None = None
        # No tracemalloc across calls: a trace of whole calls leaves the heap fragmented, and resident
        # memory steps up by megabytes for good (measured with JAX), which this doctor would then see as
        # growth. The models probe and the gc census name what piles up across calls instead.
        self.doctor = KerasDoctor(self._calls, "across calls", without=("tracemalloc",), **self._call_options)
        # The across-calls doctor serves /metrics for the callback's life; each fit's doctor feeds it too.
        self._fit_publisher = self.doctor._publisher and self.doctor._publisher.sibling(clock="batch")
        self._batch_options = {k: v for k, v in self._batch_options.items() if not k.startswith("prometheus_")}
        self._atexit = partial(_finish_at_exit, self)  # held by atexit until finish(), so an unfinished callback still writes
        atexit.register(self._atexit)
        termination.register(self)  # on SIGTERM: finish(SIGTERM), noted in the across-calls doctor's summary

    # --- what users call -----------------------------------------------------------------------------

    @property
    def summary(self) -> Summary:
        """The cumulative summary: final after `finish()`, else a snapshot of every call so far."""
        if self._result is not None:
            return self._result
        return self._cumulative()

    def finish(self, exception: BaseException | None = None) -> Summary:
        """End the callback: conclude what is pending, write, plot and print the final summary. Safe to call
        more than once; the instance ignores later fit/predict calls. `exception`: what ended the run, if
        anything (an out-of-memory error gets its post-mortem)."""
        if self._result is not None:
            return self._result
        atexit.unregister(self._atexit)
        self._guard.call("keras callback", self._abandon, exception)
        final = self.doctor.finish(exception)
        self._result = self._cumulative(final)
        self._write(self._result)
        if self.settings.plot_path is not None:
            self._guard.call("plot", self._result.plot, self.settings.plot_path)
        if self.settings.verbose and self.settings.rank == 0 and self.doctor.steps:
            print(self._result.text(), file=sys.stderr)
        termination.unregister(self)  # only now: a SIGTERM while finishing still finds it
        return self._result

    def __copy__(self) -> "_Hooks":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "_Hooks":
        """The instance itself: KerasTuner deep-copies the callbacks of every trial, and a copy would split
        the one history that makes growth across trials visible."""
        return self

    def __enter__(self) -> "_Hooks":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.finish(exc)
        return False

    # --- Keras hooks ---------------------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        self._guard.call("keras callback", self._begin, "train")

    def on_test_begin(self, logs: Any = None) -> None:
        self._guard.call("keras callback", self._begin, "test")

    def on_predict_begin(self, logs: Any = None) -> None:
        self._guard.call("keras callback", self._begin, "predict")

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        """The step of the previous batch ends here. Stepping at a batch's begin rather than its end keeps
        Keras's batch-end callbacks asynchronous (it runs them in a thread pool unless a callback overrides
        a batch-end hook), and with them the loss's copy to the host off the training thread."""
        fit = self._fit
        if fit is not None and len(self._open) == 1:
            self._step_batch(fit)
            fit.pending = True
            self._batches += 1

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._fit is not None:
            self._step_batch(self._fit)  # the epoch's last batch
        if self._fit is not None and isinstance(logs, dict):
            readings = self._guard.call("keras callback", lambda: self._fit.doctor.readings, default={})
            logs.update({f"{self.log_prefix}/{name}": value for name, value in readings.items()
                         if not name.startswith("len(")})  # container sizes stay in the summary

    def on_train_end(self, logs: Any = None) -> None:
        self._guard.call("keras callback", self._end, "train")

    def on_test_end(self, logs: Any = None) -> None:
        self._guard.call("keras callback", self._end, "test")

    def on_predict_end(self, logs: Any = None) -> None:
        self._guard.call("keras callback", self._end, "predict")

    # --- calls -------------------------------------------------------------------------------------

    def _begin(self, kind: str) -> None:
        if self._result is not None:
            return
        if self._open and (kind == "train" or self._open[0] != "train"):  # the previous call raised
            self._abandon()
        self._open.append(kind)
        if len(self._open) > 1:  # validation inside fit, or a call from a callback: part of the call
            return
        site = keras_integration.caller_site()
        self._calls.begin(_KINDS[kind], self._model, site)
        if kind == "train":
            number = self.doctor.steps + 1
            label = f"fit() call {number}" + (f" at {site}" if site else "")
            options = {**self._batch_options, "oom_snapshot": None}  # the across-calls doctor records it
            if options.get("on_limit") == "stop":
                options["checkpoint"] = self._saver(number, options.get("checkpoint"))
            self._fit = _Fit(number, KerasDoctor(self._calls, label, self._model, publisher=self._fit_publisher,
                                                 **options))

    def _end(self, kind: str) -> None:
        if self._result is not None or not self._open or self._open[-1] != kind:
            return
        self._open.pop()
        if self._open:
            return
        self._end_fit()
        self._calls.end(self._model)
        self.doctor.step()
        self._model = None  # the callback keeps no model alive between calls
        shown = self.settings.verbose and self.settings.rank == 0 and (self.params or {}).get("verbose", 1) != 0
        if kind == "train" and (shown or self.settings.summary_path is not None):
            summary = self._cumulative()
            self._write(summary)
            if shown:
                print(summary.text(), file=sys.stderr)

    def _abandon(self, exception: BaseException | None = None) -> None:
        """A call that began and never ended (it raised, or was interrupted): note it, end its fit doctor."""
        if self._open:
            self._notes.append(f"call {self.doctor.steps + 1}, {_KINDS[self._open[0]]}() at {self._calls.site}, "
                               f"did not return (it raised, or was interrupted)")
            self._open.clear()
            self._end_fit(exception)

    def _step_batch(self, fit: _Fit) -> None:
        if fit.pending and fit.doctor is not None:
            fit.pending = False
            fit.doctor.step()
            if fit.doctor.should_stop and self._model is not None:
                self._model.stop_training = True

    def _saver(self, number: int, user: Callable[[], Any] | None) -> Callable[[], str]:
        """The checkpoint on_limit="stop" takes in fit `number`: the user's `checkpoint=` (guarded), then the
        model, saved as a .keras file next to the summary (else in the working directory)."""
        def save() -> str:
            if user is not None:
                self._guard.call("checkpoint", user)
            folder = self.settings.summary_path.parent if self.settings.summary_path else Path.cwd()
            batch = self._fit.doctor.steps if self._fit and self._fit.doctor else self._batches
            path = folder / f"leakdoctor-stop-fit{number}-batch{batch}.keras"
            self.model.save(path)  # `model`, not `_model`: on JAX it syncs the state of the running fit first
            return str(path)

        return save

    def _end_fit(self, exception: BaseException | None = None) -> None:
        """Finish the current fit's doctor and keep what the cumulative summary needs of it."""
        fit, self._fit = self._fit, None
        if fit is None or fit.doctor is None:
            return
        self._step_batch(fit)
        batches = fit.doctor.finish(exception)
        self._watched_fits += batches.unwatched is None
        ended = _Fit.ended(fit.number, fit.doctor.label, batches)
        self._fit_probe_seconds += ended.probe_seconds
        if ended.findings or ended.notes or ended.errors or ended.stopped or ended.oom:  # a clean fit leaves nothing
            self._fits.append(dataclasses.replace(ended, probe_seconds=0.0))

    # --- the cumulative summary ----------------------------------------------------------------------

    def _cumulative(self, calls: Summary | None = None) -> Summary:
        """The across-calls summary, with the findings of every fit's batches on the clock of calls."""
        calls = calls or self.doctor.summary
        findings = list(calls.findings)
        keys = {f.key for f in findings}
        notes = list(calls.notes) + self._notes
        errors = list(calls.errors) + [{"part": "callback " + e["part"], "error": e["error"]} for e in self._guard.errors]
        probe_seconds = calls.overhead.get("probe_seconds", 0.0) + self._fit_probe_seconds
        running = self._fit
        batches = running.doctor.summary if running and running.doctor else None
        now = [_Fit.ended(running.number, running.doctor.label, batches)] if running and batches else []
        for fit in self._fits + now:
            for finding in fit.findings:
                if finding.key not in keys:
                    keys.add(finding.key)
                    findings.append(finding)
            notes += fit.notes
            errors += fit.errors
            probe_seconds += fit.probe_seconds
        total = calls.overhead.get("step_seconds", 0.0)
        overhead = {**calls.overhead, "probe_seconds": probe_seconds,
                    "fraction_of_step_time": probe_seconds / total if total else 0.0}
        notes.insert(0, f"steps are fit/evaluate/predict calls ({_count(calls.steps, 'call')}, "
                        f"{_count(self._batches, 'training batch')}); the series hold one reading at the end of "
                        f"each call")
        fits = self._fits + now
        stopped = next((fit.stopped for fit in fits if fit.stopped), calls.stopped)
        died = next((fit.oom for fit in reversed(fits) if fit.oom), calls.oom)
        watched = self._watched_fits or (batches is not None and batches.unwatched is None)
        return dataclasses.replace(calls, findings=findings, notes=notes, errors=errors, overhead=overhead,
                                   stopped=stopped, oom=died, unwatched=None if watched else calls.unwatched)

    def _write(self, summary: Summary) -> None:
        path = self.settings.summary_path
        if path is None or "summary_path" in self._guard.off:
            return
        try:
            summary.write(path)
        except OSError as err:
            self._guard.disable("summary_path", f"cannot write {path}: {err}; the summary follows on stderr")
            print(summary.to_json(), file=sys.stderr)


def per_call(finding: Finding, call: int, batches: int, label: str) -> Finding:
    """A finding of one fit's batches on the clock of calls: at that call, its rates per call (per batch
    times the fit's batches), the batch detail kept in the evidence."""
    def scale(rate: float | None) -> float | None:
        return None if rate is None else rate * batches

    remedy = finding.remedy and dataclasses.replace(finding.remedy, applied_step=call, rate_after=scale(finding.remedy.rate_after))
    interval = finding.rate_interval and (finding.rate_interval[0] * batches, finding.rate_interval[1] * batches)
    return dataclasses.replace(
        finding, first_step=call, detected_step=call, rate_per_step=finding.rate_per_step * batches,
        detected_rate=scale(finding.detected_rate), rate_interval=interval, remedy=remedy,
        evidence=f"within {label} ({batches} batches; from batch {finding.first_step}, "
                 f"{format_value(finding.rate_per_step, finding.unit)} per batch): {finding.evidence}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")


def _finish_at_exit(callback: "_Hooks") -> None:
    """Write the final summary at interpreter exit if nobody called finish()."""
    callback.finish(oom.uncaught())


def __getattr__(name: str) -> Any:
    """Build LeakDoctorCallback on first use, so importing this module imports no framework by itself."""
    if name != "LeakDoctorCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    keras = keras_integration.require()
    cls = type("LeakDoctorCallback", (_Hooks, keras.callbacks.Callback), {
        "__module__": __name__,
        "__qualname__": "LeakDoctorCallback",
        "__doc__": "A Keras callback that watches memory across fit/evaluate/predict calls and within each fit, "
                   "names leaks, remedies them when allowed (`remedies=`) and writes one summary. Options: those "
                   "of leakdoctor.LeakDoctor (for the batches of each fit), `log_prefix` (the logs keys' prefix) "
                   "and `call_options` (the across-calls doctor's warmup, window, investigate_steps, "
                   "verify_windows, horizon; in calls).",
    })
    globals()[name] = cls
    return cls
