"""A metric's spec and the probe that reads it: how one series is read, what it means, and what reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from leakdoctor._base.units import UNITS

__all__ = ["UNITS", "MetricSpec", "Probe", "FunctionProbe"]


@dataclass(frozen=True)
class MetricSpec:
    """How to read one series. `primary` metrics can raise a suspicion; `supporting` ones are evidence.
    `limit` is the level at which the run fails (a memory limit), used for projections. `source` tells
    rules where the metric comes from ("process", "gauge", "container", a framework); `where` is the
    place to name in a finding. `confirmed_by` names cheap counters that show what a growth of this
    metric keeps (malloc's bytes in use for resident memory): a suspicion is confirmed on them before the
    forensics run (leakdoctor/_judging/triage.py); empty, the metric proves itself and is investigated at once.
    `covers` names a metric whose growth this one counts too, as the limit counts it (a cgroup's charge
    covers resident memory): a leak that explains that metric is projected onto this one, which carries
    the limit.
    `lower_bound`: a count that misses events between samples (the MLX trace sentinel counts at most one
    a sample): its slope is a lower bound, and a rate a window counted exactly is not lowered by it."""

    name: str
    unit: str = "bytes"
    role: str = "primary"
    limit: float | None = None
    source: str = ""
    where: str | None = None
    confirmed_by: tuple[str, ...] = ()
    covers: str | None = None
    lower_bound: bool = False

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit {self.unit!r} for {self.name!r}: expected one of {UNITS}")
        if self.role not in ("primary", "supporting"):
            raise ValueError(f"role {self.role!r} for {self.name!r}: expected 'primary' or 'supporting'")


class Probe(Protocol):
    """A cheap reading taken on every sample (or every `every`-th sample): microseconds, no allocation
    spikes. The doctor samples every step unless that would cost more than 0.5% of step time. A probe
    whose read is expensive throttles itself (see integrations/_process.Throttled), says so with `paced = True` (the
    doctor then asks it on every sample instead of also reading it more rarely by its measured cost), and
    also defines `read_now()`, an unthrottled read, which the cleanup ladder of an investigation uses. A
    probe whose read is the floor of a sample (one counter that most leaks show in) says `essential =
    True`: it is read on every sample, never thinned by its cost. A probe that holds something open (a
    file descriptor) defines `close()`, which the doctor calls at finish. A probe whose metric names are
    known before it reads lists them in `metrics`, so that a user gauge cannot take one of those names; one
    whose `read_now` also gives counters that confirm a suspicion (_judging/triage.py) lists those in
    `confirms`."""

    name: str
    every: int

    def read(self) -> Mapping[str, float]: ...

    def spec(self, metric: str) -> MetricSpec: ...


@dataclass
class FunctionProbe:
    """A probe made of a function returning {metric: value} and the specs of those metrics."""

    name: str
    fn: Callable[[], Mapping[str, float]]
    specs: Mapping[str, MetricSpec]
    every: int = 1

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(self.specs)

    def read(self) -> Mapping[str, float]:
        return self.fn()

    def spec(self, metric: str) -> MetricSpec:
        return self.specs[metric]
