"""Storage for one metric: bounded memory however long the run.

Three views of the samples: running scalars (start after warm-up, end, peak); a pyramid of window
minima for the detector (level 0: the minimum of each span of `window` steps, however many samples
fell in it; each higher level: minima of `fanout` entries of the level below, so a slow leak can be
tested over a long stretch); and a decimated history of at most `history` points for the summary and
the plot. Windows are spans of steps, not counts of samples, so sampling less often (to save time)
does not delay detection.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from leakdoctor._base.metric import MetricSpec


class Series:
    def __init__(self, spec: MetricSpec, window: int, warmup: int, fanout: int = 4, depth: int = 48,
                 history: int = 1024) -> None:
        self.spec = spec
        self.window = window
        self.warmup = warmup
        self.fanout = fanout
        self.depth = depth
        self.start: float | None = None
        self.end: float | None = None
        self.end_step = 0
        self.peak = -np.inf
        self.levels: list[deque[tuple[int, float]]] = [deque(maxlen=depth)]
        self._pending: list[list[tuple[int, float]]] = [[]]  # entries waiting to form the next level
        self._history: list[tuple[int, float]] = []
        self._history_cap = history
        self._stride = 1
        self._seen = 0
        self._window_id: int | None = None
        self._window_min: tuple[int, float] | None = None

    def add(self, step: int, value: float, next_step: int | None = None) -> list[int]:
        """Record one sample; return the pyramid levels that gained a new minimum. A span of `window`
        steps closes when the first sample of a later span arrives, or at once when the next sample is
        due (`next_step`) in a later span: sampled less often than once a window, a window's one sample
        is its minimum, and waiting for the next would add a whole stride to every detection. A sample
        that still falls in a span closed early (the pace quickened) is left out of the pyramid."""
        value = float(value)
        self.end, self.end_step = value, step
        if value > self.peak:
            self.peak = value
        self._seen += 1
        if not (self._seen - 1) % self._stride:
            self._remember(step, value)
        if step <= self.warmup:
            return []
        if self.start is None:
            self.start = value
        window_id = self._window_of(step)
        if window_id == self._window_id and self._window_min is None:  # closed early
            return []
        closed: list[int] = []
        if window_id != self._window_id:
            if self._window_min is not None:
                closed = self._push(0, self._window_min)
            self._window_id, self._window_min = window_id, (step, value)
        elif value < self._window_min[1]:  # type: ignore[index]
            self._window_min = (step, value)
        if next_step is not None and self._window_of(next_step) != window_id:
            closed = sorted({*closed, *self._push(0, self._window_min)})  # type: ignore[arg-type]
            self._window_min = None
        return closed

    def _window_of(self, step: int) -> int:
        return (step - self.warmup - 1) // self.window

    def _push(self, level: int, entry: tuple[int, float]) -> list[int]:
        self.levels[level].append(entry)
        if level + 1 == len(self.levels):
            self.levels.append(deque(maxlen=self.depth))
            self._pending.append([])
        pending = self._pending[level + 1]
        pending.append(entry)
        if len(pending) < self.fanout:
            return [level]
        lowest = min(pending, key=lambda e: e[1])
        pending.clear()
        return [level] + self._push(level + 1, lowest)

    def _remember(self, step: int, value: float) -> None:
        """Keep every `_stride`-th sample; halve the history (and double the stride) when it is full."""
        self._history.append((step, value))
        if len(self._history) > self._history_cap:
            self._history = self._history[::2]
            self._stride *= 2

    def minima(self, level: int = 0, since: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Steps and values of the level's window minima that lie after step `since`."""
        entries = [e for e in self.levels[level] if e[0] > since] if level < len(self.levels) else []
        if not entries:
            return np.empty(0, dtype=np.int64), np.empty(0)
        steps, values = zip(*entries)
        return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float)

    def history(self, since: int = 0, until: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Decimated (step, value) samples in (since, until]."""
        pts = [p for p in self._history if p[0] > since and (until is None or p[0] <= until)]
        if not pts:
            return np.empty(0, dtype=np.int64), np.empty(0)
        steps, values = zip(*pts)
        return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float)

    @property
    def points(self) -> list[tuple[int, float]]:
        return list(self._history)

    @property
    def history_stride(self) -> int:
        return self._stride
