"""The engine's feed into the trackers: the same `publish` the Prometheus exporter's Publisher has (the engine
calls it after a sample, and at finish() with the final values), and `conclude` once the summary and the plot
are written. It turns what it is given into scalars and the findings whose state changed, and hands them to
each tracker through the doctor's Guard: a tracker that raises is reported once (a LeakDoctorWarning and an
entry in the summary's errors) and switched off, and the run goes on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from leakdoctor.trackers import adapt
from leakdoctor.trackers.base import Tracker, finding_record

if TYPE_CHECKING:
    from leakdoctor._base.guard import Guard
    from leakdoctor.reporting.summary import Finding, Summary
    from leakdoctor.settings import Settings

__all__ = ["Feed", "feed_for"]

#: The finding states counted as scalars (`leakdoctor/findings/leak`), present or not, so that a chart
#: starts at 0 rather than at the first finding.
STATES = ("leak", "remedied", "benign")


class Feed:
    """The trackers of one doctor. Each is opened at the first publish after a step (so that the script's run,
    opened after the doctor was made, is found) and its calls are guarded under `tracker NAME`. A copy inherited through a
    fork (a DataLoader worker that steps the parent's doctor) sends nothing: the writers and runs, and their
    threads, are the parent's."""

    def __init__(self, trackers: Sequence[Tracker], guard: "Guard") -> None:
        self.trackers = list(trackers)
        self._guard = guard
        self._pid = os.getpid()
        self._opened = False
        self._states: dict[Any, str] = {}  # finding key -> the state the trackers were last told
        names = [t.name for t in self.trackers]  # the guard's part per tracker: `tracker mlflow` (`#2` if twice)
        self._parts = {id(t): f"tracker {t.name}" + (f" #{names[:i].count(t.name) + 1}" if names.count(t.name) > 1
                                                      else "") for i, t in enumerate(self.trackers)}

    def publish(self, step: int, readings: Mapping[str, float], findings: Sequence["Finding"],
                projected_limit_step: int | None, overhead: Mapping[str, float], verdict: str | None = None) -> None:
        """After a sample (and at finish(), with the final values): the scalars, and the findings that
        appeared or changed state since the last publish."""
        if os.getpid() != self._pid or (step == 0 and not self._opened):  # no step: no run to make
            return
        self._open()
        values = scalars(readings, findings, projected_limit_step, overhead)
        changed = [f for f in findings if self._states.get(f.key) != f.final_state]
        self._states.update((f.key, f.final_state) for f in changed)
        records = [finding_record(f) for f in changed]
        for tracker in self.trackers:
            self._call(tracker, tracker.scalars, step, values)
            if records:
                self._call(tracker, tracker.findings, step, records)

    def conclude(self, summary: "Summary", plot: Path | None) -> None:
        """At the end, after the summary (and the plot) were written: the verdict, then close each tracker
        (one that failed before is still closed, quietly, so that its files are flushed). A doctor that
        never stepped opened none, and sends nothing."""
        if os.getpid() != self._pid or not self._opened:
            return
        for tracker in self.trackers:
            self._call(tracker, tracker.verdict, summary, plot)
            if self._parts[id(tracker)] in self._guard.off:
                _quietly(tracker.close)
            else:
                self._call(tracker, tracker.close)

    def _open(self) -> None:
        if not self._opened:
            self._opened = True
            for tracker in self.trackers:
                self._call(tracker, tracker.open)

    def _call(self, tracker: Tracker, method: Callable[..., Any], *args: Any) -> None:
        self._guard.call(self._parts[id(tracker)], method, *args)


def scalars(readings: Mapping[str, float], findings: Sequence["Finding"], projected_limit_step: int | None,
            overhead: Mapping[str, float]) -> dict[str, float]:
    """What a sample adds to the charts: every series' latest value, the findings by state, the step at
    which a leak is projected to reach the memory limit (when one is), and the doctor's share of run time."""
    values = {name: float(value) for name, value in readings.items()}
    for state in STATES:
        values[f"findings/{state}"] = float(sum(f.final_state == state for f in findings))
    if projected_limit_step is not None:
        values["projected_limit_step"] = float(projected_limit_step)
    values["overhead_fraction"] = float(overhead.get("fraction_of_run_time", 0.0))
    return values


def feed_for(settings: "Settings", guard: "Guard") -> Feed | None:
    """The feed a doctor's settings ask for (`trackers=`), or None. Names open a tracker on rank 0 only, as
    only rank 0 prints and writes the summary; a writer or run the script passed is used on any rank."""
    items = [item for item in settings.trackers if not isinstance(item, str) or settings.rank == 0]
    trackers = [guard.call(f"tracker {_label(item)}", adapt, item) for item in items]
    trackers = [tracker for tracker in trackers if tracker is not None]
    return Feed(trackers, guard) if trackers else None


def _label(item: Any) -> str:
    return item if isinstance(item, str) else type(item).__name__


def _quietly(method: Callable[[], Any]) -> None:
    try:
        method()
    except Exception:  # noqa: BLE001 - already reported once; closing is only a courtesy
        pass
