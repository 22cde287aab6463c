"""How many steps apart to do something that costs time (a sample, a periodic remedy), so that it takes
at most `budget` of step time. The cost is measured, not assumed, and robustly: the first measurement
(one-time costs) is skipped, one slow measurement (a context switch on a busy machine) cannot dominate
the average, and the interval grows at most twofold at a time."""

from __future__ import annotations

import math


class Pacer:
    def __init__(self, budget: float, minimum: int = 1, maximum: int = 64) -> None:
        self.budget = budget
        self.minimum = minimum
        self.maximum = maximum
        self.every = minimum
        self.cost = 0.0
        self._measured = 0

    def update(self, cost: float, step_seconds: float) -> int:
        """Record one run's cost (seconds); return the steps until the next run."""
        self._measured += 1
        if self._measured == 2:
            self.cost = cost
        elif self._measured > 2:
            self.cost = 0.8 * self.cost + 0.2 * min(cost, 4 * self.cost)
        if self.cost and step_seconds > 0:
            wanted = math.ceil(self.cost / (self.budget * step_seconds))
            self.every = max(self.minimum, min(wanted, 2 * self.every, self.maximum))
        return self.every
