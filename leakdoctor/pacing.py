"""How many steps apart to do something that costs time (a sample, a periodic remedy), so that it takes
at most `budget` of step time. The cost is measured, not assumed: the median of the last RECENT runs'
costs. A caller that hands in the mean cost of a few runs at a time (the doctor does) gets the
occasional dear run (a window that closes and runs the statistics) paid for, while rare outliers (a
first call, a context switch on a busy machine) cannot dominate. The first run (one-time costs) is
left out, and the interval grows at most twofold at a time."""

from __future__ import annotations

import math
from collections import deque

#: Runs whose costs set the estimate.
RECENT = 32


class Pacer:
    def __init__(self, budget: float, minimum: int = 1, maximum: int = 1 << 20) -> None:
        self.budget = budget
        self.minimum = minimum
        self.maximum = maximum
        self.every = minimum
        self.cost = 0.0
        self._recent: deque[float] = deque(maxlen=RECENT)
        self._runs = 0

    def update(self, cost: float, step_seconds: float) -> int:
        """Record one run's cost (seconds); return the steps until the next run."""
        self._runs += 1
        if self._runs == 1:
            return self.every
        self._recent.append(cost)
        ordered = sorted(self._recent)
        n = len(ordered)
        self.cost = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
        if self.cost > 0 and step_seconds > 0:
            wanted = math.ceil(self.cost / (self.budget * step_seconds))
            self.every = max(self.minimum, min(wanted, 2 * self.every, self.maximum))
        return self.every
