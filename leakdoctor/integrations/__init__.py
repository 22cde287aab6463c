"""What an integration hands the engine: probes, forensics, cleanups, diagnosis rules and targets.

An integration is plain data built by a factory function in one module per framework
(`process.integration()`, `torch.integration(model)`, ...). The engine only reads it: probes feed the
series, forensics run during an investigation, cleanups form the "clear it, does it still grow?" ladder,
rules turn evidence into findings (a Rule, and the Evidence it reads, are judging/evidence.py's), and
targets are the objects a remedy may act on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

if TYPE_CHECKING:
    from leakdoctor.judging.evidence import Rule

UNITS = ("bytes", "count", "seconds")


@dataclass(frozen=True)
class MetricSpec:
    """How to read one series. `primary` metrics can raise a suspicion; `supporting` ones are evidence.
    `limit` is the level at which the run fails (a memory limit), used for projections. `source` tells
    rules where the metric comes from ("process", "gauge", "container", a framework); `where` is the
    place to name in a finding. `confirmed_by` names cheap counters that show what a growth of this
    metric keeps (malloc's bytes in use for resident memory): a suspicion is confirmed on them before the
    forensics run (judging/triage.py); empty, the metric proves itself and is investigated at once.
    `covers` names a metric whose growth this one counts too, as the limit counts it (a cgroup's charge
    covers resident memory): a leak that explains that metric is projected onto this one, which carries
    the limit."""

    name: str
    unit: str = "bytes"
    role: str = "primary"
    limit: float | None = None
    source: str = ""
    where: str | None = None
    confirmed_by: tuple[str, ...] = ()
    covers: str | None = None

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit {self.unit!r} for {self.name!r}: expected one of {UNITS}")
        if self.role not in ("primary", "supporting"):
            raise ValueError(f"role {self.role!r} for {self.name!r}: expected 'primary' or 'supporting'")


class Probe(Protocol):
    """A cheap reading taken on every sample (or every `every`-th sample): microseconds, no allocation
    spikes. The doctor samples every step unless that would cost more than 0.5% of step time. A probe
    whose read is expensive throttles itself (see process.Throttled), says so with `paced = True` (the
    doctor then asks it on every sample instead of also reading it more rarely by its measured cost), and
    also defines `read_now()`, an unthrottled read, which the cleanup ladder of an investigation uses. A
    probe whose read is the floor of a sample (one counter that most leaks show in) says `essential =
    True`: it is read on every sample, never thinned by its cost. A probe that holds something open (a
    file descriptor) defines `close()`, which the doctor calls at finish. A probe whose metric names are
    known before it reads lists them in `metrics`, so that a user gauge cannot take one of those names; one
    whose `read_now` also gives counters that confirm a suspicion (judging/triage.py) lists those in
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


class Forensic(Protocol):
    """An expensive look that runs only during an investigation: `begin()`, some steps, `end()`.
    `end` returns a report object that rules read from `Evidence.reports[name]`. A forensic may also
    define `baseline()`, called after the first step of the window: a tracer started at `begin` sees
    the step's own temporaries only from then on, so a baseline taken then cancels them out."""

    name: str

    def begin(self) -> None: ...

    def end(self, steps: int) -> Any: ...


@dataclass(frozen=True)
class Cleanup:
    """One rung of the cleanup ladder: harmless to the numbers, may free memory (gc, cache clears).
    A `settle` cleanup (malloc_trim) hands freed memory back to the OS: it is a rung of its own first,
    and also runs after every other rung, so each rung's drop in RSS is what that rung freed.
    Framework cache clears are named "clear_cache" (the clear_cache remedy repeats them); one too costly
    for every investigation (jax.clear_caches recompiles everything) sets `in_ladder=False` and serves
    only remedies, under a name of its own ("clear_compile_cache")."""

    name: str
    run: Callable[[], object]
    settle: bool = False
    in_ladder: bool = True


@dataclass
class Integration:
    """Everything one framework contributes to a doctor."""

    name: str
    probes: list[Probe] = field(default_factory=list)
    forensics: list[Forensic] = field(default_factory=list)
    cleanups: list[Cleanup] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    targets: dict[str, Any] = field(default_factory=dict)
    #: At finish(), where a series grew and no finding explains it (judging/last_look.py): one bounded
    #: look at what is alive now, given the steps after warm-up; the findings of a cause it proves.
    last_looks: list[Callable[[int], list[Any]]] = field(default_factory=list)
