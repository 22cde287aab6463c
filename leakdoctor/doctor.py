"""The public LeakDoctor: the one engine (_engine.py), composed with a framework part (framework.py).

`LeakDoctor` checks the options, builds its engine from the settings and the framework part it is given
(the plain Python part by default; the framework modules in `leakdoctor.callbacks` build theirs and hand
it over), registers how the run is finished if the script never finishes it (_unattended.py), and counts
the steps that do nothing itself: such a step costs a decrement and a comparison. The engine does the rest:
a sampled step reads the probes (_reading/), the clinic investigates, diagnoses, treats and verifies
(_judging/), the limit watch acts on what it found (_lifecycle/), and _closing.py ends the run with the
summary (reporting/). Data flows one way: probes → series → detector → investigation → diagnosis →
remedy → verification → summary.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

from leakdoctor import _closing as closing
from leakdoctor._engine import Engine
from leakdoctor.framework import Framework
from leakdoctor._base.findings import Finding
from leakdoctor._base.integration import Integration
from leakdoctor._base.metric import UNITS
from leakdoctor._options import refuse_unknown
from leakdoctor.remedies._base import Remedy
from leakdoctor.reporting import _exporter as exporter
from leakdoctor.reporting.summary import Summary
from leakdoctor.settings import DoctorOptions, Settings, documented
from leakdoctor._unattended import Registration

if TYPE_CHECKING:
    import threading

    from typing_extensions import Unpack

    from leakdoctor._lifecycle.heartbeat import Heartbeat

__all__ = ["LeakDoctor", "STATE_SCHEMA"]

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
        integrations: extra probes, forensics, rules and remedies (`leakdoctor.integrations.Integration`),
            after the framework part's. Rarely needed.
        part: the framework part (`leakdoctor.framework.Framework`): its integration, how its ranks
            agree on a stop, how it finishes a rank's summary, where its metrics go. The framework doctors
            build theirs; None: the plain Python part.
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

    def __init__(self, *, integrations: Sequence[Integration] = (), part: Framework | None = None,
                 **options: Unpack[DoctorOptions]) -> None:
        refuse_unknown(type(self), options)
        part = (part or Framework(name=type(self).framework)).with_integrations(integrations)
        self._engine = Engine(Settings.create(**options), part)
        # The exporter last but for the registrations: a bad port raises here, with nothing registered.
        self._engine.start_publisher()
        Registration(self, self._engine)
        if self._engine.settings.sampler != "inline":
            self._engine.start_thread()

    @property
    def settings(self) -> Settings:
        """The doctor's settings (`leakdoctor.settings.Settings`)."""
        return self._engine.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self._engine.settings = settings

    @property
    def targets(self) -> dict[str, Any]:
        """What the integrations found to watch and treat (the model, the optimizer, ...)."""
        return self._engine.targets

    # --- what users call -------------------------------------------------------------------------

    def watch(self, name: str, gauge: Callable[[], float], unit: str = "count", timeout: float = 1.0) -> None:
        """Track a user gauge every step, e.g. `doctor.watch("nodes", lambda: len(graph.nodes))`. A gauge is
        paced by its measured cost, like a probe, and called on a worker thread; one whose call takes more
        than `timeout` seconds (or hangs, at any call) is switched off with a warning, and the loop goes on
        after at most `timeout` seconds (leakdoctor/_reading/gauges.py)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"watch: name {name!r} must be a non-empty string")
        engine = self._engine
        if engine.probes.known(name) or engine.watchlist.has(name):
            raise ValueError(f"watch: name {name!r} must be a new name, not one of a series the doctor records "
                             f"already (taken: {sorted(engine.probes.names() | engine.watchlist.names())})")
        if not callable(gauge):
            raise ValueError(f"watch({name!r}): gauge must be a callable returning a number, got {gauge!r}")
        if unit not in UNITS:
            raise ValueError(f"watch({name!r}): unit {unit!r}, expected one of {UNITS}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
            raise ValueError(f"watch({name!r}): timeout={timeout!r:.40}, expected seconds > 0 (at most a day), "
                             f"e.g. 1.0")
        with self._engine.lock:
            self._engine.watchlist.add_gauge(name, gauge, unit, float(timeout))

    def watch_object(self, obj: Any, name: str | None = None, include_private: bool = False) -> None:
        """Count the items of `obj`'s list/dict/set/tuple/deque attributes (or of `obj` itself if it is
        one) every step, so a container that keeps growing is named. Private attributes only if asked."""
        if obj is None:
            raise ValueError("watch_object: obj is None")
        label = name or type(obj).__name__
        if not isinstance(label, str) or not label:
            raise ValueError(f"watch_object: name {name!r} must be a non-empty string")
        with self._engine.lock:
            self._engine.watchlist.add_object(obj, label, include_private)

    def step(self, **context: Any) -> None:
        """Call once at the end of every training step. Keyword arguments (this step's arrays, loss,
        state) are handed to remedies that need them, e.g. force_eval evaluates them."""
        engine = self._engine
        engine.quiet -= 1  # quiet_step's test, inlined: a method call would double a quiet step's cost
        if engine.quiet >= 0:
            engine.steps += 1
        else:
            engine.step(context)

    def quiet_step(self) -> bool:
        """Count this step if the doctor has nothing to do on it (no sample due, no window open, no remedy
        acting), and say so: True when it was counted; False when nothing was counted and `step()` must
        take it. For a doctor that prepares work of its own for `step()` (the JAX doctor hands the
        optimizer's state to the cond scan) and skips it on the steps that need none."""
        engine = self._engine
        engine.quiet -= 1
        if engine.quiet >= 0:
            engine.steps += 1
            return True
        return False  # the count stays below zero: step() takes this step

    def finish(self, exception: BaseException | None = None) -> Summary:
        """End the run: conclude what is pending, build the summary, write, plot and print it. Safe to
        call more than once (from any thread); later calls return the same summary. A SIGTERM that
        comes meanwhile takes effect once the summary is written (termination.finishing)."""
        return closing.finish(self._engine, exception)

    @property
    def summary(self) -> Summary:
        """The final summary after `finish()`, else a snapshot of the run so far."""
        return self._engine.summary_now()

    def metrics_feed(self, **labels: str) -> exporter.Publisher | None:
        """A feed into this doctor's /metrics server for another doctor of the same run, whose series carry
        `labels` besides this doctor's (e.g. `clock="batch"`); None when this doctor serves no metrics."""
        publisher = self._engine.publisher
        return publisher.sibling(**labels) if publisher is not None else None

    @property
    def finished(self) -> bool:
        """True once `finish()` ended the run (then `summary` is final)."""
        return self._engine.result is not None

    @property
    def steps(self) -> int:
        return self._engine.steps

    @property
    def should_stop(self) -> bool:
        """True once on_limit="stop" decided to end the run (loops: `if doctor.should_stop: break`)."""
        return self._engine.limit_watch.should_stop

    @property
    def readings(self) -> dict[str, float]:
        """The latest value of every series, e.g. for a framework logger."""
        return self._engine.readings

    @property
    def active_remedies(self) -> list[Remedy]:
        """Remedies currently applied (being verified, or verified effective)."""
        return [t.remedy for t in self._engine.clinic.treatments]

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on from this one (for checkpoints): the step count, findings and
        notes. The series stay with this process."""
        engine = self._engine
        with engine.lock:
            return {"schema": STATE_SCHEMA, "steps": engine.steps,
                    "findings": [f.to_dict() for f in engine.clinic.findings], "notes": list(engine.clinic.notes)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from a `state_dict()`; call it before the first step. Steps count on from the saved ones,
        and a new warm-up follows them, since this process's memory starts afresh."""
        engine = self._engine
        if engine.steps:
            raise RuntimeError(f"load_state_dict: call it before the first step (this doctor is at step {engine.steps})")
        if not isinstance(state, Mapping) or state.get("schema") != STATE_SCHEMA:
            raise ValueError(f"load_state_dict: expected a dict from LeakDoctor.state_dict() (schema {STATE_SCHEMA!r})")
        engine.steps = engine.sampler.sampled_step = int(state["steps"])
        engine.clinic.restore([Finding.from_dict(f) for f in state["findings"]], list(state["notes"]))
        engine.settings = dataclasses.replace(engine.settings, warmup=engine.settings.warmup + engine.steps)
        engine.monitor.settings = engine.clinic.settings = engine.sampler.settings = engine.settings

    def write_summary(self, summary: Summary | None = None) -> bool:
        """Write `summary` (default: the run so far) to `summary_path` now, atomically, e.g. a callback's
        summary at the end of each fit; True if it was written. A path that fails is reported once and
        not tried again: the final summary then goes to stderr."""
        return closing.write_summary(self._engine, summary)

    def __enter__(self) -> "LeakDoctor":
        self._engine.sampler.restart()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.finish(exc)
        return False

    # --- the engine's parts, named as before for the tests and benchmarks that read them ------------

    @property
    def _lock(self) -> threading.RLock:
        return self._engine.lock

    @property
    def _heartbeat(self) -> Heartbeat:
        return self._engine.heartbeat

    @property
    def _publisher(self) -> exporter.Publisher | None:
        return self._engine.publisher
