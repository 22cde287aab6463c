"""Reading the probes on a sampled step, each on its own schedule.

A probe is read on every `probe.every`-th sample, and more rarely when its read costs more than
CHEAP_READ: its measured cost (a robust running average of the cheaper of two reads in a row every TIMED reads:
a read slowed by another process, or by a garbage collection, is not the cheaper one) sets how many samples to
skip, so a probe that walks a large model's hooks or lists `jax.live_arrays()` costs about as much per
sample, on average, as one that reads a counter. A probe that paces itself (`paced`: it decides on each
sample whether to read, within a budget of its own, as process.Throttled does) is asked on every sample
and never timed here: the reads on which it measures, charged again as the cost of every read, would thin
it a second time (tens of samples apart), so that its series got too few windows to raise a suspicion in
a short run. A probe whose read is the floor of a sample (`essential`: resident memory's single pread)
is read on every sample whatever its measured cost, which after a step that evicted the caches is mostly
cache misses that any read would pay: thinned, the series that finds most leaks would close its windows
half as often. A probe that raises is switched off, once.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Mapping, Sequence

from leakdoctor._base.guard import Guard
from leakdoctor._base.metric import MetricSpec, Probe

#: Seconds a probe may cost per sample on average; a dearer probe is read every ceil(cost / CHEAP_READ)
#: samples. A counter read costs 1-5 µs; walking hooks or live arrays costs tens to thousands.
CHEAP_READ = 20e-6
#: The cost of two reads in a row of a probe is measured every TIMED reads (timing each read would cost as
#: much as a read).
TIMED = 16


class _Scheduled:
    __slots__ = ("probe", "read", "every", "period", "countdown", "reads", "cost", "timed", "paced", "pending")

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.read = probe.read
        self.every = self.period = max(1, int(probe.every))
        self.countdown = 0
        self.reads = 0
        self.cost = 0.0
        self.paced = bool(getattr(probe, "paced", False))  # a probe that paces itself is not paced again
        self.timed = not self.paced and not getattr(probe, "essential", False)
        self.pending: float | None = None  # the cost of the first of two timed reads in a row

    def due_timing(self) -> bool:
        """Is this read (the `reads`-th) to be timed: the first of a pair, or the second?"""
        phase = self.reads % TIMED
        return self.timed and (phase == 0 or phase == 1 and self.pending is not None)

    def timed_read(self, cost: float) -> None:
        """Hold the first cost of a pair; record the cheaper of the two. One read slowed by something
        else (a garbage collection, page faults) would otherwise set a counter's period for the next
        TIMED reads: read every few samples, its series closes windows later than the others', and
        the investigation opens without it."""
        if self.pending is None:
            self.pending = cost
            return
        cost, self.pending = min(cost, self.pending), None
        self.measured(cost)

    def measured(self, cost: float) -> None:
        """Record one read's cost and set the period between reads."""
        self.cost = cost if not self.cost else 0.8 * self.cost + 0.2 * min(cost, 4 * self.cost)
        self.period = max(self.every, math.ceil(self.cost / CHEAP_READ))


class Probes:
    def __init__(self, probes: Sequence[Probe], specs: Mapping[str, MetricSpec], guard: Guard) -> None:
        self._scheduled = [_Scheduled(p) for p in probes]
        #: Seconds spent in the reads of probes that pace themselves: within their own budget, so the
        #: doctor's pacer leaves them out (paying for them again would starve the samples that ask them).
        self.paced_seconds = 0.0
        self._specs = dict(specs)
        self._guard = guard

    def spec(self, metric: str) -> MetricSpec:
        return self._specs[metric]

    def known(self, metric: str) -> bool:
        """Is `metric` a series of these probes (read already, or declared in a probe's `metrics`)?"""
        return metric in self._specs or metric in self.names()

    def names(self) -> set[str]:
        """The metrics read so far and those the probes declare."""
        return set(self._specs).union(*(getattr(s.probe, "metrics", ()) for s in self._scheduled))

    def threaded(self) -> list[Probe]:
        """The probes that can be read off the training thread: those that give a reader for it
        (`thread_reader`), such as resident memory's."""
        return [s.probe for s in self._scheduled if hasattr(s.probe, "thread_reader")]

    def read_due(self) -> dict[str, float]:
        """Readings of the probes due on this sample."""
        readings: dict[str, float] = {}
        specs = self._specs
        for scheduled in self._scheduled:
            scheduled.countdown -= 1
            if scheduled.countdown > 0:
                continue
            scheduled.countdown = scheduled.period
            scheduled.reads += 1
            clocked = scheduled.paced or scheduled.due_timing()
            start = time.perf_counter() if clocked else 0.0
            try:
                values = scheduled.read()
                if not values.keys() <= specs.keys():
                    self._learn(scheduled.probe, values)
            except Exception as err:  # noqa: BLE001 - a failing probe must not end the user's run
                self._switch_off(scheduled.probe, err)
                continue
            if clocked:
                if scheduled.paced:
                    self.paced_seconds += time.perf_counter() - start
                else:
                    scheduled.timed_read(time.perf_counter() - start)
            readings.update(values)
        return readings

    def read_all(self) -> dict[str, float]:
        """Fresh readings of every probe, also those that throttle themselves (`read_now`): the cleanup
        ladder's, which must see every metric before and after each rung."""
        readings: dict[str, float] = {}
        for scheduled in list(self._scheduled):
            probe = scheduled.probe
            self._add(readings, probe, getattr(probe, "read_now", probe.read))
        return readings

    def read_for(self, names: set[str]) -> dict[str, float]:
        """Fresh readings of the probes that give any of `names` (in their `metrics` or `confirms`): a
        triage's counters (_judging/triage.py), read through its steps without the other probes."""
        readings: dict[str, float] = {}
        for scheduled in list(self._scheduled):
            probe = scheduled.probe
            gives = {*getattr(probe, "metrics", ()), *getattr(probe, "confirms", ())}
            if gives & names:
                self._add(readings, probe, getattr(probe, "read_now", probe.read))
        return {name: value for name, value in readings.items() if name in names}

    def close(self) -> None:
        """Let go of what probes hold open (a file descriptor); a probe reopens it if read again."""
        for scheduled in self._scheduled:
            close = getattr(scheduled.probe, "close", None)
            if close is not None:
                self._guard.call(f"probe {scheduled.probe.name}", close)

    def _add(self, readings: dict[str, float], probe: Probe, read: Callable[[], Mapping[str, float]]) -> None:
        try:
            values = read()
            self._learn(probe, values)
        except Exception as err:  # noqa: BLE001 - a failing probe must not end the user's run
            self._switch_off(probe, err)
            return
        readings.update(values)

    def _learn(self, probe: Probe, values: Mapping[str, float]) -> None:
        """Remember the spec of each metric the probe reads for the first time."""
        for metric in values:
            if metric not in self._specs:
                self._specs[metric] = probe.spec(metric)

    def _switch_off(self, probe: Probe, err: Exception) -> None:
        self._scheduled = [s for s in self._scheduled if s.probe is not probe]
        self._guard.disable(f"probe {probe.name}", f"{type(err).__name__}: {err}")
