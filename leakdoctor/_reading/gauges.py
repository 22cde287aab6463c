"""User gauges (`doctor.watch(name, gauge)`) under a time budget: a gauge is the user's code, called at
sampled steps, and a slow or hanging one must not stop training.

- Every call is bounded by its timeout (`watch(..., timeout=1.0)`, seconds): gauges are called on a
  worker thread (one per process, a daemon) while the training thread waits at most the timeout; a call
  that does not return by then switches the gauge off (a LeakDoctorWarning and an entry in the summary's
  `errors`), and the loop goes on (the worker stays with the gauge; the next call gets a new one). So a
  gauge that answered quickly and then hangs (a lock taken elsewhere) cannot block the loop either. The
  gauges due on a sample are handed over together, so the handoff (~50 µs, two thread switches) is paid
  once a sample, not once a gauge. A call on another thread reads that thread's thread-local state (a
  CUDA current device).
- Paced like a probe: every call is timed, and a gauge is called every ceil(cost / CHEAP_READ) samples,
  its cost the cheaper of its last two calls (one call slowed by a garbage collection does not thin it;
  a gauge that became slow is thinned after two calls). A gauge paces itself (`paced`): the doctor's
  pacer leaves its time out, and the summary's overhead counts it, the handoff included.
- A budget per read: once the gauges of one read took READ_BUDGET, the gauges not yet called stay due
  and are called first at the next read (so twenty slow gauges cost one step a gauge, not one step all
  of them).
- The cleanup ladder's fresh readings (`read_now`, 3+ times an investigation, around every rung) call a
  gauge again only when that is cheap: its cost is under LADDER_FRESH, or its calls then take at most
  LADDER_SHARE of the time since its last call. Any other gauge gives the ladder its latest value.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from typing import Any, Callable, Mapping

from leakdoctor._base.guard import Guard
from leakdoctor._base.metric import MetricSpec
from leakdoctor._reading.probing import CHEAP_READ

#: Seconds a gauge's call may take by default; a gauge that takes longer is switched off.
TIMEOUT = 1.0
#: Seconds the gauges of one read may take together before the rest wait for the next read.
READ_BUDGET = 0.05
#: A gauge that costs less than this (seconds) is called afresh on every rung of the cleanup ladder.
LADDER_FRESH = 1e-3
#: A dearer gauge is called afresh by the ladder only if its calls take at most this share of the time.
LADDER_SHARE = 0.05


class _Gauge:
    __slots__ = ("fn", "timeout", "countdown", "period", "last", "previous", "value", "called_at")

    def __init__(self, fn: Callable[[], float], timeout: float) -> None:
        self.fn = fn
        self.timeout = timeout
        self.countdown = 0
        self.period = 1
        self.last: float | None = None  # seconds of the last call; None before the first
        self.previous: float | None = None
        self.value: float | None = None  # the latest value read
        self.called_at = -math.inf  # when the latest call was made (time.perf_counter())

    @property
    def cost(self) -> float:
        """Seconds a call is expected to take: the cheaper of the last two (0 before the first)."""
        if self.last is None:
            return 0.0
        return self.last if self.previous is None else min(self.last, self.previous)

    def timed(self, seconds: float) -> None:
        """Record a call's cost and set the samples between calls (as probing._Scheduled does)."""
        self.previous, self.last = self.last, seconds
        self.period = max(1, math.ceil(self.cost / CHEAP_READ))

    def fresh_for_ladder(self, now: float) -> bool:
        """May the cleanup ladder call it again now (see the module's docstring)?"""
        cost = self.cost
        return cost < LADDER_FRESH or cost <= LADDER_SHARE * (now - self.called_at)


class _Call:
    """One gauge call handed to the worker: its value or exception, its own duration, and when it ended. A
    call that the worker takes up after `not_after` (the read's budget spent) is not made (`skipped`)."""

    __slots__ = ("fn", "not_after", "value", "error", "seconds", "done", "skipped")

    def __init__(self, fn: Callable[[], Any], not_after: float) -> None:
        self.fn, self.not_after = fn, not_after
        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.done = threading.Event()
        self.skipped = False

    def run(self) -> None:
        start = time.perf_counter()
        if start > self.not_after:
            self.skipped = True
        else:
            try:
                self.value = self.fn()
            except BaseException as err:  # noqa: BLE001 - handed to the training thread, which reports it
                self.error = err
            self.seconds = time.perf_counter() - start
        self.done.set()


class _Worker:
    """A daemon thread that calls gauges for the training thread. Abandoned (`stuck`) when a call outlived
    its timeout: it ends once that call returns, if ever, without making the calls queued behind it."""

    def __init__(self) -> None:
        self.stuck = False
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="leakdoctor-gauges", daemon=True).start()

    def _serve(self) -> None:
        while not self.stuck:
            call = self._calls.get()
            if not self.stuck:
                call.run()

    def submit(self, fns: list[Callable[[], Any]], budget: float) -> list[_Call]:
        """Queue the calls, in order, at once (one wake-up of the worker for all of them); those the worker
        comes to once `budget` seconds went by are not made (the first always is)."""
        not_after = time.perf_counter() + budget
        calls = [_Call(fn, math.inf if i == 0 else not_after) for i, fn in enumerate(fns)]
        for call in calls:
            self._calls.put(call)
        return calls

    def wait(self, call: _Call, timeout: float) -> bool:
        """Wait for `call` at most `timeout` seconds; False (and the worker abandoned) if it did not end."""
        if call.done.wait(timeout):
            return True
        self.stuck = True
        return False


_worker: _Worker | None = None
_worker_lock = threading.Lock()

#: What `_calls_on_worker` answers for a gauge whose call did not return within its timeout, and for one
#: whose call was not made (over the read's budget, or queued behind a call that timed out).
TIMED_OUT, SKIPPED = "timed out", "skipped"


def _calls_on_worker(gauges: list[_Gauge], budget: float) -> list[_Call | str]:
    """Call `gauges` on the worker, in order, each waited for at most its timeout; once `budget` seconds
    went by, the calls the worker has not come to yet are not made. One entry per gauge: its finished
    call, TIMED_OUT (the worker is then abandoned) or SKIPPED."""
    global _worker
    with _worker_lock:  # one read at a time: a second training thread waits for the first's gauges
        if _worker is None or _worker.stuck:
            _worker = _Worker()
        worker = _worker
        calls = worker.submit([gauge.fn for gauge in gauges], budget)
        results: list[_Call | str] = []
        for gauge, call in zip(gauges, calls):
            if worker.stuck:
                results.append(SKIPPED)
            elif not worker.wait(call, gauge.timeout):
                results.append(TIMED_OUT)
            else:
                results.append(SKIPPED if call.skipped else call)
        return results


def _forked() -> None:
    """In a forked child: no worker thread came along, and the locks may have been held by one that did not."""
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
        """Every gauge, due or not (the cleanup ladder's readings): called afresh where that is cheap
        (_Gauge.fresh_for_ladder), else its latest value."""
        return self._read(due_only=False)

    def _read(self, due_only: bool) -> dict[str, float]:
        values: dict[str, float] = {}
        if not self._gauges:
            return values
        now = time.perf_counter()
        chosen: list[tuple[str, _Gauge]] = []
        for name, gauge in list(self._gauges.items()):
            if due_only:
                gauge.countdown -= 1
                if gauge.countdown <= 0:
                    chosen.append((name, gauge))
            elif gauge.fresh_for_ladder(now):
                chosen.append((name, gauge))
            elif gauge.value is not None:  # too dear to call again for the ladder: its latest value
                values[name] = gauge.value
        chosen.sort(key=lambda item: item[1].countdown)  # the longest overdue (left by a budget) first
        if not chosen:
            return values
        results = _calls_on_worker([gauge for _, gauge in chosen], READ_BUDGET)
        for (name, gauge), result in zip(chosen, results):
            if result == SKIPPED:
                if not due_only and gauge.value is not None:
                    values[name] = gauge.value
                continue
            value = self._outcome(name, gauge, result, now)
            if value is not None:
                values[name] = value
        return values

    def _outcome(self, name: str, gauge: _Gauge, result: _Call | str, now: float) -> float | None:
        """A call's value, the gauge paced by its own cost; the gauge switched off (None) if it timed out,
        raised, or returned no number."""
        if not isinstance(result, _Call):
            self._off(name, f"did not return within its timeout of {gauge.timeout:g} s (it may hang); "
                            f"the loop went on without it")
            return None
        if result.error is not None:
            if not isinstance(result.error, Exception):  # a KeyboardInterrupt or SystemExit raised by the gauge
                raise result.error
            self._off(name, f"{type(result.error).__name__}: {result.error}")
            return None
        if result.seconds > gauge.timeout:
            self._off(name, f"took {result.seconds:.2f} s, over its timeout of {gauge.timeout:g} s")
            return None
        gauge.timed(result.seconds)
        gauge.countdown, gauge.called_at = gauge.period, now
        try:
            gauge.value = float(result.value)
        except Exception as err:  # noqa: BLE001 - a gauge that returns no number is switched off
            self._off(name, f"{type(err).__name__}: {err}")
            return None
        return gauge.value

    def _off(self, name: str, reason: str) -> None:
        self._gauges.pop(name, None)
        self._guard.disable(f"gauge {name!r}", reason)
