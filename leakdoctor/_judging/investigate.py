"""One investigation: a bounded forensic window around suspected growth.

begin: run the cleanup ladder (recording every metric after each rung), then start the forensics. Halfway,
run the ladder again. After `length` steps, end: stop the forensics (in reverse order), run the ladder a
last time, and hand the readings and reports to diagnosis as Evidence. Growth that survives the ladder is
real; growth that one rung took back names the remedy that repeats that rung.

The heap walks begin before tracemalloc starts (the tracer begins last), which would charge each of their
allocations. They end in the reverse of the integrations' order, as they always did: the framework's walks
(the tensor census) while it still traces, so the tracer stops well after the window's last step. Stopped
right after a step, a torchrun rank crashed: Python 3.11's tracemalloc.stop() races with another thread's
allocations, and a gloo thread still allocates for the step's all-reduce.
"""

from __future__ import annotations

import math
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


class Investigation:
    def __init__(self, suspects: Mapping[str, Trend], start_step: int, length: int, forensics: Sequence[Forensic],
                 cleanups: Sequence[Cleanup], read: Callable[[], Mapping[str, float]], guard: Guard) -> None:
        self.suspects = dict(suspects)
        self.start_step = start_step
        self.length = length
        self._forensics = list(forensics)
        self._cleanups = list(cleanups)
        self._read = read
        self._guard = guard
        self._begin = run_ladder(self._cleanups, self._read, self._guard, start_step)
        self._middle: Ladder | None = None
        with heap.one_walk():  # the censuses share one walk of the heap
            for forensic in sorted(self._forensics, key=lambda f: getattr(f, "tracer", False)):  # the tracer last
                guard.call(f"forensic {forensic.name}", forensic.begin)

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
        reports = self._stop(step)
        end = run_ladder(self._cleanups, self._read, self._guard, step)
        return Evidence(self.start_step, step, self.suspects, dict(trends), dict(specs), self._begin, end, reports,
                        remedies, middle=self._middle, horizon=horizon)

    def abort(self, step: int) -> None:
        """Stop the forensics without a diagnosis (the run ended mid-window, or the engine switched off)."""
        self._stop(step)

    def _stop(self, step: int) -> dict[str, object]:
        reports = {}
        with heap.one_walk():
            for forensic in reversed(self._forensics):
                report = self._guard.call(f"forensic {forensic.name}", forensic.end, step - self.start_step)
                if report is not None:
                    reports[forensic.name] = report
        return reports
