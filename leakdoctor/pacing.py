"""How many steps apart to do something that costs time (a sample, a periodic remedy), so that it takes
at most `budget` of step time. The cost is measured, not assumed: the mean of the last RECENT runs less
the slowest one, so the occasional dear run (a window that closes and runs the statistics) is paid for
in full, while one outlier (a context switch on a busy machine) cannot dominate. The first run (one-time
costs) is left out, and the interval grows at most twofold at a time."""

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
        self._total = 0.0
        self._runs = 0

    def update(self, cost: float, step_seconds: float) -> int:
        """Record one run's cost (seconds); return the steps until the next run."""
        self._runs += 1
        if self._runs == 1:
            return self.every
        recent = self._recent
        if len(recent) == RECENT:
            self._total -= recent[0]
        recent.append(cost)
        self._total = self._total + cost if self._runs % 1024 else sum(recent)  # no drift over long runs
        n = len(recent)
        self.cost = (self._total - max(recent)) / (n - 1) if n > 2 else self._total / n
        if self.cost > 0 and step_seconds > 0:
            wanted = math.ceil(self.cost / (self.budget * step_seconds))
            self.every = max(self.minimum, min(wanted, 2 * self.every, self.maximum))
        return self.every
