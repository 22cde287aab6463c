"""User gauges (`doctor.watch(name, gauge)`) under a time budget: a gauge is the user's code, called on the
training thread at sampled steps, and a slow or hanging one must not stop training.

- Paced like a probe: every call is timed (two clock reads), and a gauge is called every
  ceil(cost / CHEAP_READ) samples, its cost the cheaper of its last two calls (one call slowed by a
  garbage collection does not thin it; a gauge that became slow is thinned after two calls). A gauge
  paces itself (`paced`): the doctor's pacer leaves its time out, and the summary's overhead counts it.
- A timeout (`watch(..., timeout=1.0)`, seconds): a gauge whose call takes longer is switched off, with a
  LeakDoctorWarning and an entry in the summary's `errors`.
- A hanging gauge does not block the loop for good: a gauge's first call, and every call after one that
  took more than THREADED_ABOVE, runs on a worker thread (one per process, a daemon) while the training
  thread waits at most the timeout; a call that does not return by then switches the gauge off, and the
  loop goes on (the worker stays with the gauge; the next threaded call gets a new one). A gauge whose
  last call was quick is called inline, as cheap as a function call: a handoff to a thread costs about
  0.1 ms, which a gauge read every step cannot afford. So a gauge that was quick and then hangs (a lock
  taken elsewhere) blocks as the user's own code would; one that is slow, or hangs on its first call,
  cannot. A threaded call runs on another thread: a gauge that reads thread-local state (a CUDA current
  device) reads the worker's on its first call.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from typing import Any, Callable, Mapping

from leakdoctor.integrations import MetricSpec
from leakdoctor.lifecycle.guard import Guard
from leakdoctor.reading.probing import CHEAP_READ

#: Seconds a gauge's call may take by default; a gauge that takes longer is switched off.
TIMEOUT = 1.0
#: A gauge whose last call took longer than this (seconds) is called on the worker thread, with the timeout.
THREADED_ABOVE = 1e-3


class _Gauge:
    __slots__ = ("fn", "timeout", "countdown", "period", "last", "previous")

    def __init__(self, fn: Callable[[], float], timeout: float) -> None:
        self.fn = fn
        self.timeout = timeout
        self.countdown = 0
        self.period = 1
        self.last: float | None = None  # seconds of the last call; None before the first
        self.previous: float | None = None

    def timed(self, seconds: float) -> None:
        """Record a call's cost and set the samples between calls (as probing._Scheduled does)."""
        self.previous, self.last = self.last, seconds
        cost = seconds if self.previous is None else min(seconds, self.previous)
        self.period = max(1, math.ceil(cost / CHEAP_READ))


class _Call:
    """One gauge call handed to the worker: its value or exception, its own duration, and when it ended."""

    __slots__ = ("fn", "value", "error", "seconds", "done")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        start = time.perf_counter()
        try:
            self.value = self.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the training thread, which reports it
            self.error = err
        self.seconds = time.perf_counter() - start
        self.done.set()


class _Worker:
    """A daemon thread that calls gauges for the training thread. Abandoned (`stuck`) when a call outlived
    its timeout: it ends once that call returns, if ever."""

    def __init__(self) -> None:
        self.stuck = False
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="leakdoctor-gauges", daemon=True).start()

    def _serve(self) -> None:
        while not self.stuck:
            self._calls.get().run()

    def call(self, fn: Callable[[], Any], timeout: float) -> _Call | None:
        """The finished call, or None when it did not finish within `timeout` seconds."""
        call = _Call(fn)
        self._calls.put(call)
        if call.done.wait(timeout):
            return call
        self.stuck = True
        return None


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def _call_on_worker(fn: Callable[[], Any], timeout: float) -> _Call | None:
    global _worker
    with _worker_lock:  # one call at a time: a second training thread waits for the first's gauge
        if _worker is None or _worker.stuck:
            _worker = _Worker()
        return _worker.call(fn, timeout)


def _forked() -> None:
    """In a forked child: no worker thread came along, and the lock may have been held by one that did not."""
    global _worker, _worker_lock
    _worker, _worker_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class Gauges:
    """The user's gauges, one probe that paces each of them (see the module's docstring). `specs` is
    shared with the Watchlist, which answers for the names taken."""

    name = "gauges"
    every = 1
    paced = True

    def __init__(self, guard: Guard, specs: dict[str, MetricSpec]) -> None:
        self._guard = guard
        self._specs = specs
        self._gauges: dict[str, _Gauge] = {}

    def add(self, name: str, fn: Callable[[], float], timeout: float = TIMEOUT) -> None:
        self._gauges[name] = _Gauge(fn, timeout)

    def __len__(self) -> int:
        return len(self._gauges)

    def spec(self, metric: str) -> MetricSpec:
        return self._specs[metric]

    def read(self) -> Mapping[str, float]:
        """The gauges due on this sample."""
        return self._read(due_only=True)

    def read_now(self) -> Mapping[str, float]:
        """Every gauge, due or not (the cleanup ladder's fresh readings)."""
        return self._read(due_only=False)

    def _read(self, due_only: bool) -> dict[str, float]:
        values: dict[str, float] = {}
        if not self._gauges:
            return values
        for name, gauge in list(self._gauges.items()):
            if due_only:
                gauge.countdown -= 1
                if gauge.countdown > 0:
                    continue
            value = self._call(name, gauge)
            gauge.countdown = gauge.period
            if value is not None:
                values[name] = value
        return values

    def _call(self, name: str, gauge: _Gauge) -> float | None:
        if gauge.last is None or gauge.last > THREADED_ABOVE:
            call = _call_on_worker(gauge.fn, gauge.timeout)
            if call is None:
                self._off(name, f"did not return within its timeout of {gauge.timeout:g} s (it may hang); "
                                f"the loop went on without it")
                return None
            value, error, seconds = call.value, call.error, call.seconds
        else:
            start = time.perf_counter()
            try:
                value, error = gauge.fn(), None
            except Exception as err:  # noqa: BLE001 - one bad gauge must not stop the others
                value, error = None, err
            seconds = time.perf_counter() - start
        if error is not None:
            if not isinstance(error, Exception):  # a KeyboardInterrupt or SystemExit raised by the gauge itself
                raise error
            self._off(name, f"{type(error).__name__}: {error}")
            return None
        if seconds > gauge.timeout:
            self._off(name, f"took {seconds:.2f} s, over its timeout of {gauge.timeout:g} s")
            return None
        gauge.timed(seconds)
        try:
            return float(value)
        except Exception as err:  # noqa: BLE001 - a gauge that returns no number is switched off
            self._off(name, f"{type(err).__name__}: {err}")
            return None

    def _off(self, name: str, reason: str) -> None:
        self._gauges.pop(name, None)
        self._guard.disable(f"gauge {name!r}", reason)
