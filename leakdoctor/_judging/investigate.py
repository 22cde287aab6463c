"""One investigation: a bounded forensic window around suspected growth.

begin: run the cleanup ladder (recording every metric after each rung), start the forensics, and freeze what
the collector tracks (gc.freeze). Halfway, run the ladder again. After `length` steps, end: stop the tracer
and the forensics that read it, thaw, run the ladder a last time, and stop the heap walks; then hand the
readings and reports to diagnosis as Evidence. Growth that survives the ladder is real; growth that one rung
took back names the remedy that repeats that rung.

Cost: two full collections, the first and last ladders'. Frozen, the objects alive at the window's start
are left out of the middle ladder's collection, which collects only what the first half made (the old
objects that died in cycles meanwhile are freed at the end: their memory counts in the first half's growth,
and comes off the second's, so a churn of such objects never passes for growth in both halves). The heap
walks run outside tracemalloc, which would charge each of their allocations, and end on the heap as the last
ladder left it, as they began on the first's.
"""

from __future__ import annotations

import gc
import math
import weakref
from typing import Callable, Mapping, Sequence

from leakdoctor._base.evidence import Evidence, Ladder
from leakdoctor._base.guard import Guard
from leakdoctor._base.integration import Cleanup, Forensic
from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.trend import Trend
from leakdoctor.integrations import _heap as heap


def run_ladder(cleanups: Sequence[Cleanup], read: Callable[[], Mapping[str, float]], guard: Guard,
               step: int) -> Ladder:
    """Read every metric; then again after each settle cleanup, and after each other cleanup followed
    by the settle cleanups (so freed memory has left the process before it is measured)."""
    settle = [c for c in cleanups if c.settle]
    rungs = [("before", _finite(read()))]
    for cleanup in settle + [c for c in cleanups if not c.settle]:
        for action in [cleanup] + ([] if cleanup.settle else settle):
            guard.call(f"cleanup {action.name}", action.run)
        rungs.append((cleanup.name, _finite(read())))
    return Ladder(rungs, frozenset(c.name for c in settle), step)


def _finite(readings: Mapping[str, float]) -> dict[str, float]:
    """The readings less NaN and inf (a gauge that failed to measure), which the ladder leaves out as the
    series do."""
    return {metric: value for metric, value in readings.items() if math.isfinite(value)}


#: Where a forensic begins and ends around the tracer (Forensic.tracing), in the order they begin.
TRACE_ORDER = ("outside", "tracer", "inside")


def _tracing(forensic: Forensic) -> str:
    return getattr(forensic, "tracing", "outside")


def _freeze(owner: object) -> Callable[[], object]:
    """Freeze what the collector tracks; returns the thaw, to call once, which also runs if `owner` is
    dropped unfinished (or at exit). A program that froze objects of its own keeps them frozen: the window
    then collects as it is."""
    if gc.get_freeze_count():
        return lambda: None
    gc.freeze()
    return weakref.finalize(owner, gc.unfreeze)


class Investigation:
    def __init__(self, suspects: Mapping[str, Trend], start_step: int, length: int, forensics: Sequence[Forensic],
                 cleanups: Sequence[Cleanup], read: Callable[[], Mapping[str, float]], guard: Guard) -> None:
        self.suspects = dict(suspects)
        self.start_step = start_step
        self.length = length
        self._forensics = sorted(forensics, key=lambda f: TRACE_ORDER.index(_tracing(f)))
        self._cleanups = list(cleanups)
        self._read = read
        self._guard = guard
        self._begin = run_ladder(self._cleanups, self._read, self._guard, start_step)
        self._middle: Ladder | None = None
        with heap.one_walk():  # the censuses share one walk of the heap
            self._start(traced=False)
        self._start(traced=True)
        self._thaw = _freeze(self)

    def join(self, suspects: Mapping[str, Trend]) -> None:
        """Suspects raised while the window is open: the ladders have read them from its start, so the
        evidence judges them on the whole window, as if they had been suspect from the first step."""
        self.suspects.update(suspects)

    def due(self, step: int) -> bool:
        return step - self.start_step >= self.length

    def tick(self, step: int) -> None:
        """Called on every step of the window: the forensics take their baseline after the first step,
        and the ladder runs once more halfway, so growth must hold in both halves of the window."""
        if step == self.start_step + 1:
            for forensic in self._forensics:
                if hasattr(forensic, "baseline"):
                    self._guard.call(f"forensic {forensic.name}", forensic.baseline)
        if step == self.start_step + self.length // 2:
            self._middle = run_ladder(self._cleanups, self._read, self._guard, step)

    def finish(self, step: int, trends: Mapping[str, Trend], specs: Mapping[str, MetricSpec],
               remedies: tuple[str, ...], horizon: int) -> Evidence:
        reports = self._stop(step, traced=True)
        self._thaw()
        end = run_ladder(self._cleanups, self._read, self._guard, step)
        reports.update(self._stop(step, traced=False))
        return Evidence(self.start_step, step, self.suspects, dict(trends), dict(specs), self._begin, end, reports,
                        remedies, middle=self._middle, horizon=horizon)

    def abort(self, step: int) -> None:
        """Stop the forensics without a diagnosis (the run ended mid-window)."""
        self._stop(step, traced=True)
        self._thaw()
        self._stop(step, traced=False)

    def _start(self, traced: bool) -> None:
        """Begin the tracer and the forensics within it (`traced`), or those outside it, in order."""
        for forensic in self._forensics:
            if (_tracing(forensic) != "outside") == traced:
                self._guard.call(f"forensic {forensic.name}", forensic.begin)

    def _stop(self, step: int, traced: bool) -> dict[str, object]:
        """End the tracer and the forensics within it (`traced`), or those outside it, in reverse order."""
        reports = {}
        with heap.one_walk():
            for forensic in reversed(self._forensics):
                if (_tracing(forensic) != "outside") != traced:
                    continue
                report = self._guard.call(f"forensic {forensic.name}", forensic.end, step - self.start_step)
                if report is not None:
                    reports[forensic.name] = report
        return reports
