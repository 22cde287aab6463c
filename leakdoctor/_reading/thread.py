"""Watching resident memory off the training thread: the sampler thread.

A daemon thread reads resident memory on a time schedule, tagged with the step count, and keeps the
minimum of each window of steps. It does two things with them, each a comparison, and records nothing:
the series, the statistics and the clinic stay on the training thread, whose samples read every probe
at the same step, so that an investigation never opens on resident memory while the probes read there
(hook counts, watched lists, live arrays) lag a stride behind.

- It wakes the training thread (`wake`: its next step samples, and the doctor hurries: samples twice a
  window) when the minima of RISING windows in a row each rose, at a rate that could matter over the
  horizon: the stride the budget sets between the training thread's samples does not delay a leak.
- It raises the memory alarm (`alarm`) when resident memory passes the `watermark`, so that the
  post-mortem summary is written even while the training thread is inside a long step.

Its pace: READS_PER_WINDOW readings a window at the step time the training thread measured, at most as
often as THREAD_BUDGET of one core allows at its measured cost per tick, never further apart than
MAX_INTERVAL. It measures its cost first (COST_TICKS ticks), then watches the windows only where that
budget buys a reading a window (`affordable`, decided by sampling.py): else (short steps on a machine
where waking a thread is dear) it watches the watermark only, at MAX_INTERVAL. It is stopped by `stop()`
(the doctor's finish: it wakes at once), dies with a fork (`running` says so;
the sampler starts another in a child that steps), and never keeps the process alive (daemon). A tick
that raises ends the thread, with `failed` saying why. With `rest_when_idle` (sampler="auto") it ends by
itself (`rested`) when it has nothing to watch: no window it can afford, no watermark.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from typing import Any, Callable

#: Readings per window of steps: two, so that a window's minimum is seen even when one reading falls on a
#: step's transient peak.
READS_PER_WINDOW = 2
#: The thread's CPU time, as a share of one core, at most.
THREAD_BUDGET = 0.004
#: Seconds between readings before the step time is known, and at most ever (the alarm's reaction time).
FIRST_INTERVAL = 0.01
MAX_INTERVAL = 1.0
#: Window minima that must each rise for the thread to wake the training thread (Monitor's RISING).
RISING = 3
#: Ticks whose CPU time is averaged into the cost per tick, and measured before `affordable` is known.
COST_TICKS = 16


class SamplerThread:
    """Reads resident memory on a daemon thread: wakes the training thread on a rise, alarms near the limit.

    Args:
        read: resident memory in bytes (process.ResidentReader: the probe's descriptor, which pread shares).
        step_of: the training thread's step count (a plain attribute read), the tag of each reading.
        step_seconds: the training thread's measured wall time per step (0 while unknown).
        window: steps per detection window; warmup: the steps before the first window.
        wake: makes the training thread sample at its next step.
        alarm: called with (step, resident bytes) while resident memory is past `watermark()`.
        matters: whether a rise of (bytes per step) from (bytes) could matter over the horizon; a rise
            that could not (a page now and then) wakes nothing.
    """

    def __init__(self, read: Callable[[], float], step_of: Callable[[], int], step_seconds: Callable[[], float],
                 window: int, warmup: int, wake: Callable[[], None], alarm: Callable[[int, float], Any],
                 watermark: Callable[[], float], matters: Callable[[float, float], bool]) -> None:
        self.read, self.step_of, self.step_seconds = read, step_of, step_seconds
        self.window, self.warmup = window, warmup
        self.wake, self.alarm, self.watermark, self.matters = wake, alarm, watermark, matters
        self.watching = False  # watching the window minima (else: the watermark only), once affordable
        self.cpu_seconds = 0.0  # the thread's CPU time so far
        self.ticks = 0
        self.wakes = 0
        self.failed: str | None = None
        #: End by itself once it has nothing to watch: no windows (its budget buys no reading a window) and
        #: no watermark (no summary path, oom_watermark=None, or the post-mortem written), so that a doctor
        #: kept but never finished holds no thread (sampler="auto"; the sampler starts another when needed)
        self.rest_when_idle = False
        self.rested = False
        self.cost = 0.0  # CPU seconds per tick, a running mean
        self._open: tuple[int, int, float] | None = None  # (window, step, value) of the open window's minimum
        self._risen: deque[tuple[int, float]] = deque(maxlen=RISING + 1)  # the last closed minima, rising
        self._quiet_until = 0  # no wake before this step (one per RISING windows)
        self._stopped = False
        self._sleep = threading.Lock()
        self._sleep.acquire()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="leakdoctor-sampler", daemon=True)

    @property
    def running(self) -> bool:
        """Alive in this process (a fork leaves the thread behind in the parent), and not failed."""
        return self._thread.is_alive() and self._pid == os.getpid() and self.failed is None

    @property
    def affordable(self) -> bool | None:
        """Does the CPU budget buy a reading a window at the measured cost and step time? With a margin
        against flapping: a thread that watches the windows stops below one reading a window, one that does
        not starts at one and a half. None: not known yet (COST_TICKS ticks, and a step time)."""
        per_step = self.step_seconds()
        if self.ticks < COST_TICKS or per_step <= 0:
            return None
        readings_per_window = self.window * per_step / (self.cost / THREAD_BUDGET)
        return readings_per_window >= (1.0 if self.watching else 1.5)

    def watch_windows(self, watch: bool) -> None:
        """Watch the window minima (True), or the watermark only; the minima start afresh."""
        self.watching = watch
        self._open = None
        self._risen.clear()

    @property
    def interval(self) -> float:
        """Seconds to the next reading: READS_PER_WINDOW a window, within the CPU budget."""
        per_step = self.step_seconds()
        if self.ticks < COST_TICKS:  # its cost is being measured
            return FIRST_INTERVAL
        if not self.watching:
            return MAX_INTERVAL
        wanted = self.window * per_step / READS_PER_WINDOW if per_step > 0 else FIRST_INTERVAL
        return min(MAX_INTERVAL, max(wanted, self.cost / THREAD_BUDGET))

    def start(self) -> None:
        self._thread.start()
        try:  # its CPU clock, which another thread can read: the step's CPU time leaves this thread's out
            self._clock: int | None = time.pthread_getcpuclockid(self._thread.ident)
        except (AttributeError, OSError):  # not on this platform
            self._clock = None

    def cpu_now(self) -> float:
        """The thread's CPU time up to now, read from any thread (its last tick's count where the clock
        cannot be read: the thread ended, or the platform has none)."""
        if self._clock is not None and self._thread.is_alive():
            try:
                return time.clock_gettime(self._clock)
            except OSError:
                pass
        return self.cpu_seconds

    def stop(self, timeout: float = 1.0) -> None:
        """End the thread (from any thread but its own): it wakes at once and exits."""
        if self._stopped:
            return
        self._stopped = True
        self._sleep.release()
        if self._thread.is_alive() and self._pid == os.getpid() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self.read()  # at once: the thread's first allocations (its malloc arena) come before the steps
            # A lock held until stop() releases it: waiting on it is one C call that releases the GIL and
            # ends at once on stop() (an Event's wait is Python code, a sleep cannot be cut short)
            while not self._sleep.acquire(timeout=self.interval):
                self._tick()
                self.ticks += 1
                cpu = time.thread_time()  # all of this thread's CPU time: the sleeps' bookkeeping too
                spent, self.cpu_seconds = cpu - self.cpu_seconds, cpu
                self.cost += (spent - self.cost) / min(self.ticks, COST_TICKS)
                if self.rest_when_idle and self.affordable is False and self.watermark() == math.inf:
                    self.rested = True
                    return
        except Exception as err:  # noqa: BLE001 - the sampler reports it; the training thread's samples go on
            self.failed = f"{type(err).__name__}: {err}"

    def _tick(self) -> None:
        step = self.step_of()  # the steps done before the reading: it holds what they kept
        value = self.read()
        if value > self.watermark():
            self.wake()
            self.alarm(step, value)
        if self.watching and step > self.warmup:
            self._keep(step, value)

    def _keep(self, step: int, value: float) -> None:
        """Fold the reading into its window's minimum; the RISING-th closed minimum in a row to rise, at a
        rate that matters, wakes the training thread."""
        window = (step - self.warmup - 1) // self.window
        opened = self._open
        if opened is not None and opened[0] == window:
            if value < opened[2]:
                self._open = (window, step, value)
            return
        self._open = (window, step, value)
        if opened is None:
            return
        closed = (opened[1], opened[2])
        risen = self._risen
        if risen and closed[1] <= risen[-1][1]:
            risen.clear()
        risen.append(closed)
        if len(risen) > RISING and step >= self._quiet_until:
            (first, low), (last, high) = risen[0], risen[-1]
            if self.matters((high - low) / max(1, last - first), high):
                self._quiet_until = step + RISING * self.window
                self.wakes += 1
                self.wake()
