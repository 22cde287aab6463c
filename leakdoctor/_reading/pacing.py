"""How many steps apart to do something that costs time (a sample, a periodic remedy), so that it takes
at most `budget` of step time. The cost is measured, not assumed: the mean of the last RECENT runs'
costs, leaving out those dearer than OUTLIER times their median (a first call, a context switch on a
busy machine), which cannot dominate, while the usual dear runs (a window that closes and runs the
statistics) are paid for. What was spent beyond the budget so far (the first runs, close together while
the cost is learnt; an estimate that fell short) widens the interval until it is paid back, so the
budget holds over the run, not only per run; but at most DEBT_STRETCH times the interval the cost
alone needs, so that a one-time cost (a first read that registers a watched object, an import) is paid
back slowly rather than blinding the doctor for hundreds of steps. The first run (one-time costs) is
left out of the estimate (not of what was spent), and the interval grows at most twofold at a time."""

from __future__ import annotations

import math
from collections import deque

#: Runs whose costs set the estimate.
RECENT = 32
#: Runs over which what was spent beyond the budget is paid back.
PAYBACK = 4
#: A run dearer than this many times the median of the recent ones is an accident, not a cost.
OUTLIER = 4.0
#: Paying back a debt stretches the interval at most this many times what the cost alone needs.
DEBT_STRETCH = 2


class Pacer:
    def __init__(self, budget: float, minimum: int = 1, maximum: int = 1 << 20) -> None:
        self.budget = budget
        self.minimum = minimum
        self.maximum = maximum
        self.every = minimum
        self.cost = 0.0
        self._recent: deque[float] = deque(maxlen=RECENT)
        self._runs = 0
        self._spent = 0.0  # the runs' costs so far, and the budget of the steps they covered
        self._allowed = 0.0

    def update(self, cost: float, step_seconds: float, steps: float | None = None) -> int:
        """Record one run's cost (seconds) and the steps since the last run (default: the interval, which
        a caller that runs early at times knows better); return the steps until the next run."""
        self._runs += 1
        self._spent += cost
        self._allowed += self.budget * step_seconds * (self.every if steps is None else steps)
        if self._runs == 1:
            return self.every
        self._recent.append(cost)
        self.cost = typical_mean(self._recent)
        if self.cost > 0 and step_seconds > 0:
            debt = max(0.0, self._spent - self._allowed) / PAYBACK
            wanted = math.ceil(min(self.cost + debt, DEBT_STRETCH * self.cost) / (self.budget * step_seconds))
            self.every = max(self.minimum, min(wanted, 2 * self.every, self.maximum))
        return self.every


def typical_mean(costs: deque[float]) -> float:
    """The mean of the costs, those over OUTLIER times their median left out."""
    ordered = sorted(costs)
    n = len(ordered)
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    kept = [c for c in ordered if c <= OUTLIER * median]
    return sum(kept) / len(kept)
