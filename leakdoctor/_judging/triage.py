"""Cheap confirmation of a suspicion before a full investigation (escalate on evidence).

A suspicion on a broad series (resident memory, the workers' private memory, a count of live arrays) is
most often growth that keeps nothing: the heap an epoch's test pass leaves, pages refilled after a trim,
the workers' copy-on-write of what they share, a history of scalars. What would keep memory shows in a
narrower counter that costs at most a millisecond to read: malloc's bytes in use and the bytes Python's
objects use for resident memory, the workers' new anonymous memory for theirs, the bytes of the live arrays for their count. Such
a metric names them in its spec (`MetricSpec.confirmed_by`); the triage reads them at every step of a few
windows and confirms the suspicion only where one of them grew at a rate that matters: then, and only
then, the forensics (full collections, heap walks, tracemalloc) run. A suspect none of whose counters can
be read here (no glibc, no workers) is confirmed as it is: it goes straight to an investigation, as does
any metric that proves itself (hooks, compiles, a container's length). An exact metric that a one-time
jump lifts (the bytes of the live arrays) names itself: it is confirmed where it goes on rising.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.trend import Trend, is_material

#: Windows the counters are read over, at every step, before a suspicion is judged; and at most.
CONFIRM_WINDOWS, MAX_WINDOWS = 2, 4
#: A counter of the same unit confirms a suspicion when it rose in every window, at least this share of the
#: suspect's rate: memory that is kept shows in what backs it (resident memory grows by pages and arenas, up
#: to ten times what a loop that keeps 7 KiB of outputs a step keeps). Memory touched again or copied on
#: write leaves the counter level; a few KiB a step of malloc's or Python's bytes beside MiBs of resident
#: memory (a fit's warm-up) explain none of it. A kept growth too slow to confirm a suspicion is too slow to
#: matter over the horizon: the last look at the end of the run names a proven one (minor).
CONFIRM_SHARE = 0.1


def corroborators(suspects: Mapping[str, Trend], spec_of: Callable[[str], MetricSpec]) -> set[str] | None:
    """The counters that can confirm these suspects, or None when one of them has none (it needs no
    confirmation, or none can be read): then the suspects are investigated at once, together."""
    names: set[str] = set()
    for metric in suspects:
        backing = spec_of(metric).confirmed_by
        if not backing:
            return None
        names.update(backing)
    return names


@dataclass
class Triage:
    """The counters' readings since `start`, step by step, and the verdict on each suspect."""

    suspects: dict[str, Trend]
    start: int
    window: int
    readings: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def add(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.readings.setdefault(name, []).append((step, value))

    def join(self, suspects: Mapping[str, Trend]) -> None:
        self.suspects.update(suspects)

    def windows(self, step: int) -> int:
        return (step - self.start) // self.window

    def due(self, step: int) -> bool:
        """A verdict is due at each window's end: a confirmation from the first on (a fast leak waits no
        longer than it must), a dismissal from CONFIRM_WINDOWS on."""
        return self.windows(step) >= 1 and (step - self.start) % self.window == 0

    def judge(self, step: int, spec_of: Callable[[str], MetricSpec], level_of: Callable[[str], float],
              horizon: int) -> tuple[dict[str, Trend], dict[str, Trend]] | None:
        """(confirmed, dismissed) suspects, or None to read one more window (a counter grew, not yet enough,
        and the triage may run longer)."""
        confirmed, pending, dismissed = {}, {}, {}
        for metric, trend in self.suspects.items():
            rates = {name: self.rate(name) for name in spec_of(metric).confirmed_by}
            rates = {name: rate for name, rate in rates.items() if rate is not None}
            if not rates or any(self._confirms(metric, trend, name, rate, spec_of, level_of, horizon)
                                for name, rate in rates.items()):
                confirmed[metric] = trend
            elif any(rate > 0 for rate in rates.values()):
                pending[metric] = trend
            else:
                dismissed[metric] = trend
        windows = self.windows(step)
        if (pending or dismissed) and windows < CONFIRM_WINDOWS or pending and windows < MAX_WINDOWS:
            return None
        return confirmed, {**dismissed, **pending}

    def rate(self, name: str) -> float | None:
        """The counter's growth per step, from its first window's minimum to its last's (transients, the
        temporaries of a step read mid-way, drop out), where it never fell from one window to the next
        (else 0: a jump that was given back, or none that goes on); None when it was not read in two
        windows."""
        minima: dict[int, tuple[float, int]] = {}  # window: (its minimum, the step read)
        for step, value in self.readings.get(name, ()):
            index = (step - self.start - 1) // self.window
            if index not in minima or value < minima[index][0]:
                minima[index] = (value, step)
        if len(minima) < 2:
            return None
        ordered = [minima[i] for i in sorted(minima)]
        if any(later[0] < earlier[0] for earlier, later in zip(ordered, ordered[1:])):
            return 0.0
        (first, at), (last, then) = ordered[0], ordered[-1]
        return (last - first) / (then - at) if then > at else 0.0

    @staticmethod
    def _confirms(metric: str, trend: Trend, name: str, rate: float, spec_of: Callable[[str], MetricSpec],
                  level_of: Callable[[str], float], horizon: int) -> bool:
        suspect, counter = spec_of(metric), spec_of(name)
        if counter.unit == suspect.unit:
            return rate > 0 and rate >= CONFIRM_SHARE * trend.slope
        return is_material(counter.unit, rate, level_of(name), horizon, counter.limit)
