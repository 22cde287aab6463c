"""Python-level knowledge for every run: user gauges and watched containers (cheap, every step), a gc
census by type, a tracemalloc snapshot diff and the allocation sites of watched containers' new items
(forensics, only during an investigation), the gc.collect cleanup rung, and the rules for
container_growth (retained_graph where a watched container's items hold autograd graphs) and
python_objects."""

from __future__ import annotations

import dataclasses
import gc
import numbers
import sys
import tracemalloc
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from leakdoctor._base.evidence import Evidence, Rule
from leakdoctor._base.findings import Finding
from leakdoctor._base.guard import Guard
from leakdoctor._base.integration import Cleanup, Integration
from leakdoctor._base.messages import Record, msg
from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.source import (class_region, code_location, is_engine, is_user_file, short_path, storing_line,
                                    storing_near)
from leakdoctor._base.trend import is_material
from leakdoctor.integrations import _heap as heap
from leakdoctor.integrations._holders import CONTAINERS, Holder, keep_instead
from leakdoctor._reading.gauges import TIMEOUT, Gauges

#: A count whose items hold too little to matter is still a leak when the step's CPU time rose by this
#: share of itself while it grew: a step 40% slower is felt over a run; a busy machine's drift reached a
#: fifth and more (a neighbour's load on the other core: the test gauge of empty objects, 1 run in 16).
SLOWER = 0.4


def type_name(t: type) -> str:
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# --- cheap probes: gauges and watched containers ---------------------------------------------------

class Watchlist:
    """User gauges (`doctor.watch`) and objects whose container attributes are counted
    (`doctor.watch_object`). The containers are this probe; the gauges are `gauges`, a probe of their
    own that paces and times each (leakdoctor/_reading/gauges.py); the names of both are answered for here."""

    name = "watchlist"
    every = 1

    def __init__(self, guard: Guard) -> None:
        self._guard = guard
        self._objects: dict[str, tuple[Callable[[], Any], bool]] = {}
        self._specs: dict[str, MetricSpec] = {}
        self._containers: dict[str, Watched] = {}
        self.gauges = Gauges(guard, self._specs)

    def add_gauge(self, name: str, gauge: Callable[[], float], unit: str, timeout: float = TIMEOUT) -> None:
        where = code_location(gauge)
        self.gauges.add(name, gauge, timeout)
        self._specs[name] = MetricSpec(name, unit, source="gauge",
                                       where=f"gauge {name!r}" + (f" ({where})" if where else ""))

    def add_object(self, obj: Any, name: str, include_private: bool) -> None:
        try:
            ref: Callable[[], Any] = weakref.ref(obj)
        except TypeError:
            ref = lambda: obj  # noqa: E731 - builtin containers cannot be weakly referenced
        self._objects[name] = (ref, include_private)

    def read(self) -> Mapping[str, float]:
        values: dict[str, float] = {}
        for name, (ref, private) in list(self._objects.items()) if self._objects else ():
            obj = ref()
            if obj is None:
                del self._objects[name]
                continue
            for attr, container in self._containers_of(obj, private):
                metric = f"len({name}.{attr})" if attr else f"len({name})"
                if metric not in self._specs:
                    self._register(metric, obj, attr)
                values[metric] = float(len(container))
        return values

    def _containers_of(self, obj: Any, private: bool) -> list[tuple[str | None, Any]]:
        if isinstance(obj, CONTAINERS):
            return [(None, obj)]
        attrs = getattr(obj, "__dict__", {})
        return [(a, v) for a, v in attrs.items() if isinstance(v, CONTAINERS)
                and not a.startswith("__") and (private or not a.startswith("_"))]

    def _register(self, metric: str, obj: Any, attr: str | None) -> None:
        owner = type(obj)
        where = f"{owner.__qualname__}.{attr}" if attr else metric[4:-1]
        source = code_location(owner) if attr else None
        self._specs[metric] = MetricSpec(metric, "count", source="container",
                                         where=where + (f" ({source})" if source else ""))
        ref = weakref.ref(obj) if attr else (lambda: obj)
        self._containers[metric] = Watched(where, lambda: getattr(ref(), attr) if attr else ref(), attr,
                                           owner if attr else None,
                                           (lambda v: setattr(ref(), attr, v)) if attr else None)

    def spec(self, metric: str) -> MetricSpec:
        return self._specs[metric]

    def has(self, metric: str) -> bool:
        return metric in self._specs

    def names(self) -> set[str]:
        return set(self._specs)

    def container(self, metric: str) -> Any:
        """The live container behind a `len(...)` metric, or None."""
        watched = self._containers.get(metric)
        return watched.value() if watched else None

    def watched(self, metric: str) -> "Watched | None":
        """What is known of the container behind a `len(...)` metric: its name, owner and access."""
        return self._containers.get(metric)

    def containers(self) -> list[tuple[str, Any]]:
        """(metric, live container) of every watched container still alive."""
        found = []
        for metric, watched in list(self._containers.items()):
            value = watched.value()
            if isinstance(value, CONTAINERS):
                found.append((metric, value))
        return found


@dataclass(frozen=True)
class Watched:
    """A watched container: its name ("Trainer.history"), access to it (`get`; `rebind` replaces it on its
    owner), the attribute and the class of the object that holds it (None for a container watched itself)."""

    name: str
    get: Callable[[], Any]
    attr: str | None
    owner: type | None
    rebind: Callable[[Any], None] | None

    def value(self) -> Any:
        try:
            return self.get()
        except (AttributeError, TypeError):  # the attribute was deleted, or its owner collected
            return None


# --- forensics -------------------------------------------------------------------------------------

@dataclass
class TypeGrowth:
    """Types whose live instance count grew during the window, largest first."""

    rows: list[tuple[str, int]]

    def top(self, n: int = 3) -> str:
        return ", ".join(f"{name} +{delta}" for name, delta in self.rows[:n])


class TypeCensus:
    """Counts gc-tracked objects by type at the start and end of the window; keeps the types that
    gained at least one instance per step, leakdoctor's own (its records of the run) left out."""

    name = "gc_census"

    def __init__(self) -> None:
        self._before: Counter[type] = Counter()

    def begin(self) -> None:
        self._before = Counter(map(type, heap.objects()))

    def end(self, steps: int) -> TypeGrowth:
        after = Counter(map(type, heap.objects()))
        after.subtract(self._before)
        self._before = Counter()
        grown = [(type_name(t), n) for t, n in after.most_common(20)
                 if n >= steps and not t.__module__.startswith("leakdoctor.")]
        return TypeGrowth(grown)


@dataclass(frozen=True)
class Site:
    location: str
    size: int
    count: int
    user: bool


@dataclass
class AllocationGrowth:
    """Allocation sites (innermost user frame) whose live bytes grew during the window, largest first."""

    sites: list[Site]

    @property
    def top(self) -> Site | None:
        return self.sites[0] if self.sites else None


class AllocationDiff:
    """A tracemalloc snapshot diff over the window, grouped by the innermost frame of user code. Tracing
    starts at `begin`; the baseline snapshot is retaken one step later, once the step's temporaries
    have been allocated under tracing, so that only what accumulates shows in the diff."""

    name = "tracemalloc"
    tracer = True
    frames = 16

    def __init__(self) -> None:
        self._owned = False
        self._before: tracemalloc.Snapshot | None = None

    def begin(self) -> None:
        self._owned = not tracemalloc.is_tracing()
        if self._owned:
            tracemalloc.start(self.frames)
        self._before = tracemalloc.take_snapshot()

    def baseline(self) -> None:
        self._before = tracemalloc.take_snapshot()

    def end(self, steps: int) -> AllocationGrowth:
        after = tracemalloc.take_snapshot()
        before, self._before = self._before, None
        if self._owned:
            tracemalloc.stop()
        sites: dict[tuple[str, bool], list[int]] = {}
        for stat in after.compare_to(before, "traceback"):
            if stat.size_diff <= 0:
                continue
            key = _site_of(stat.traceback)
            if key is None:
                continue
            acc = sites.setdefault(key, [0, 0])
            acc[0] += stat.size_diff
            acc[1] += stat.count_diff
        return AllocationGrowth(_ranked(Site(loc, size, count, user) for (loc, user), (size, count) in sites.items()))


def _site_of(traceback: tracemalloc.Traceback) -> tuple[str, bool] | None:
    """The site an allocation is blamed on (file:line of _blame's frame, and whether it is the user's);
    None for what leakdoctor's engine allocated."""
    frame = _blame(traceback)
    return (f"{short_path(frame.filename)}:{frame.lineno}", is_user_file(frame.filename)) if frame else None


def _ranked(sites: Iterable[Site]) -> list[Site]:
    """The sites that grew, the user's first, then the largest."""
    return sorted((s for s in sites if s.size > 0), key=lambda s: (s.user, s.size), reverse=True)


def collector_on() -> bool:
    """Does Python's garbage collector run on its own (enabled, with a threshold)?"""
    return gc.isenabled() and gc.get_threshold()[0] > 0


@dataclass
class Cycles:
    """Objects in reference cycles that were garbage at the end of the window (gc could free them, it had
    not): how many of each type, where the user's code created them (file:line, while tracemalloc traced
    the window), the groups most numerous first, a function (a closure closing the cycle) first among
    equals; and the bytes of that garbage by the allocation site the tracemalloc diff blames."""

    rows: list[tuple[str, int]]
    sites: list[tuple[str, str, int]]  # (type, file:line, count)
    garbage: dict[str, int] = field(default_factory=dict)  # allocation site (AllocationDiff's) -> bytes

    def top(self, n: int = 3) -> str:
        return ", ".join(f"{count} {kind} (created at {site})" for kind, site, count in self.sites[:n])


class CycleCensus:
    """What a collection of cyclic garbage would free, and where it was made: at the end of the window,
    one gc.collect() with DEBUG_SAVEALL keeps the garbage it finds (finalizers run, as in any collection),
    its types are counted and its objects' creation sites read from tracemalloc (still tracing: this
    forensic ends before the allocation diff), then it is dropped again, unreachable, for the cleanup
    ladder's gc.collect() to free. Taken whether the collector runs or not, for the allocation diff that
    ends after it: what waits for a collection is not kept. The python_objects rule leaves the garbage
    counted here out of the diff, and the collection runs what waits for one: JAX releases the host
    buffers of finished computations from a gc callback (jax#14882). A Keras fit on JAX holds 150-600 KiB
    of them at any moment, rising and falling by as much over eight steps: a slow leak's worth."""

    name = "gc_cycles"
    #: Garbage objects whose creation site is looked up.
    sample = 50_000

    def begin(self) -> None:
        pass

    def end(self, steps: int) -> Cycles:
        flags, before = gc.get_debug(), len(gc.garbage)
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        try:
            gc.collect()
        finally:
            gc.set_debug(flags)
        found = gc.garbage[before:]
        if not flags & gc.DEBUG_SAVEALL:
            del gc.garbage[before:]  # the program's own gc.garbage is left as it was
        kinds = Counter(type_name(type(obj)) for obj in found)
        sites: Counter[tuple[str, str]] = Counter()
        garbage: Counter[str] = Counter()
        leaves: dict[int, Any] = {}  # what the collector does not track dies with the garbage holding it (buffers)
        for obj in found[:self.sample] if tracemalloc.is_tracing() else ():
            leaves.update((id(leaf), leaf) for leaf in gc.get_referents(obj) if not gc.is_tracked(leaf))
            site = _allocated_at(obj)  # None for an instance whose dict Python manages (3.11)
            if site is not None:
                garbage[site[0]] += sys.getsizeof(obj)  # an array's own buffer included
                if site[1]:
                    sites[(type_name(type(obj)), site[0])] += 1
        for leaf in leaves.values():
            if (where := _allocated_at(leaf)) is not None:
                garbage[where[0]] += sys.getsizeof(leaf)
        ranked = sorted(sites.items(), key=lambda item: (-item[1], item[0][0] != "function"))
        return Cycles(kinds.most_common(10), [(kind, site, n) for (kind, site), n in ranked if n >= 2], dict(garbage))


def _allocated_at(obj: Any) -> tuple[str, bool] | None:
    """Where tracemalloc saw `obj` allocated, as the allocation diff blames it (_site_of)."""
    traceback = tracemalloc.get_object_traceback(obj)
    return _site_of(traceback) if traceback else None


@dataclass
class ContainerOrigins:
    """Where the items that watched containers gained during the window were made: for each container
    metric, the user's frames (file, line), innermost first, of the allocation of each sampled new item
    (read from tracemalloc while it traced the window)."""

    stacks: dict[str, list[tuple[tuple[str, int], ...]]]


class ContainerSites:
    """The code that fills the watched containers: at the end of the window (tracemalloc still tracing:
    this forensic ends before the allocation diff), the allocation tracebacks of the newest items of
    each watched container that grew, so that a growing list is placed at the line that appends to it,
    not where its owner's class is defined."""

    name = "container_sites"
    #: Newest items per container whose allocation is looked up.
    sample = 8

    def __init__(self, watchlist: Watchlist) -> None:
        self._watchlist = watchlist
        self._lengths: dict[str, int] = {}

    def begin(self) -> None:
        self._lengths = {metric: len(container) for metric, container in self._watchlist.containers()}

    def end(self, steps: int) -> ContainerOrigins:
        stacks: dict[str, list[tuple[tuple[str, int], ...]]] = {}
        lengths, self._lengths = self._lengths, {}
        if not tracemalloc.is_tracing():
            return ContainerOrigins(stacks)
        for metric, container in self._watchlist.containers():
            gained = len(container) - lengths.get(metric, 0)
            for item in new_items(container, min(gained, self.sample)):
                traceback = tracemalloc.get_object_traceback(item)
                frames = tuple((f.filename, f.lineno) for f in reversed(traceback or ()) if is_user_file(f.filename))
                if frames:
                    stacks.setdefault(metric, []).append(frames)
        return ContainerOrigins(stacks)


def _blame(traceback: tracemalloc.Traceback) -> tracemalloc.Frame | None:
    """The innermost user frame; else the innermost frame. None for what leakdoctor's engine allocated
    itself (an engine frame comes before any user frame), which would else be blamed on the user's line
    that called doctor.step()."""
    frames = list(reversed(traceback))
    for frame in frames:
        if is_user_file(frame.filename):
            return frame
        if is_engine(frame.filename):
            return None
    return frames[0] if frames else None


# --- rules ------------------------------------------------------------------------------------------

def item_bytes(item: Any) -> int:
    """Approximate size of one container item: its buffer if it has one, else its shallow size."""
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    return sys.getsizeof(item)


def new_items(container: Any, count: int) -> list[Any]:
    """The last `count` items of a container, at most 32 of them."""
    if count <= 0 or not isinstance(container, CONTAINERS) or not len(container):
        return []
    return list(container.values() if isinstance(container, dict) else container)[-min(count, 32):]


def new_items_bytes(container: Any, count: int) -> float:
    """Estimated bytes of the last `count` items of a container (sampling at most 32 of them)."""
    items = new_items(container, count)
    return count * sum(map(item_bytes, items)) / len(items) if items else 0.0


def _where_allocated(ev: Evidence) -> Record | None:
    growth = ev.reports.get("tracemalloc")
    site = growth.top if growth else None
    return msg("allocations_growing", site=site.location, size=site.size) if site else None


def _types(ev: Evidence) -> Record | None:
    census = ev.reports.get("gc_census")
    return msg("objects_growing", types=[{"type": t, "gained": n} for t, n in census.rows[:3]]) if census and census.rows else None


def container_rule(watchlist: Watchlist) -> Rule:
    """A gauge or a watched container that keeps growing, unless what it holds is too little to matter
    (a history of losses: bytes per step that matter to no run) and the step's CPU time does not rise
    with it (a history walked every step is the Burn case, a leak of time). Items that hold an autograd
    graph always matter: their size hides the graph; no framework rule having named them, they are
    retained_graph, with the container as the holder that detach_retained acts on. Placed at the line of
    the user's code that stores into the container (container_location), with what it stores in the fix."""

    def container_growth(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        found = []
        for metric, gained in _grown_containers(ev, accepted):
            spec = ev.specs[metric]
            container = watchlist.container(metric)
            items = new_items(container, gained)
            held = new_items_bytes(container, gained)
            graphs = any(getattr(item, "grad_fn", None) is not None for item in items)  # sizes hide graphs
            if metric not in ev.suspects and not (held and _holds_the_rss_growth(ev, held)):
                continue
            if not graphs and not _costs_something(ev, metric, held, history=_numbers(items)):
                ev.note(metric, msg("small_history", growth=ev.describe(metric),
                                    held=msg("holding_about", size=held) if held else None))
                continue
            # the graphs' saved activations are what resident memory gains; their tensors' sizes hide them
            explains = [metric] + (["rss_bytes"] if _holds_the_rss_growth(ev, held) or graphs and "rss_bytes"
                                   in ev.unexplained(accepted) else [])
            accounts = {"rss_bytes": held} if held and "rss_bytes" in explains else {}
            name = spec.where.split(" (")[0] if spec.where else metric
            location = container_location(watchlist, metric, ev.reports.get("container_sites")) or spec.where
            evidence = msg("container_grew", growth=ev.describe(metric),
                           items=msg("new_items", size=held) if held else None, step_time=step_time_note(ev),
                           allocated=_where_allocated(ev))
            stores = stored(container, items, name)
            if graphs:  # tensors that keep their autograd graphs: detach_retained can free those in place
                found.append(_retained(ev, watchlist, metric, location, tuple(explains), items, stores, evidence))
                continue
            found.append(ev.finding(
                "container_growth", metric, location=location, explains=tuple(explains), subject=container,
                accounts=accounts,
                evidence=evidence,
                recommendation=msg("bound_or_clear", stores=msg("lead", what=stores) if stores else None, holder=name),
            ))
        return found

    return Rule(50, container_growth)


def _retained(ev: Evidence, watchlist: Watchlist, metric: str, location: str | None, explains: tuple[str, ...],
              items: list[Any], stores: Record | None, evidence: Record) -> Finding:
    """A watched container whose new items are tensors holding their autograd graphs (no framework
    integration saw them first): retained_graph, with the container as the holder detach_retained acts on."""
    watched = watchlist.watched(metric)
    name = watched.name if watched else metric
    sample = next((i for i in reversed(items) if _has_graph(i)), None)
    subject = []
    if watched is not None:
        region = class_region(watched.owner) if watched.owner else None
        subject = [Holder(name, "", sum(_has_graph(i) for i in items), (region,) if region else (), 0,
                          watched.value, watched.rebind)]
    return ev.finding(
        "retained_graph", metric, location=location, explains=explains, subject=subject,
        evidence=msg("items_keep_graphs", growth=evidence),
        recommendation=msg("store_detached", stores=msg("lead", what=stores), instead=keep_instead("loss", sample), holder=name,
                           remedy=_detach_note(ev, bool(subject))),
    )


def _has_graph(item: Any) -> bool:
    return getattr(item, "grad_fn", None) is not None


def _detach_note(ev: Evidence, reachable: bool) -> Record | None:
    """What remedies can do about kept graphs here, or why they cannot."""
    if not reachable:
        return msg("detach_unreachable")
    if "detach_retained" in ev.remedies:
        return None
    return msg("allow_detach", remedy="detach_retained")


def stored(container: Any, items: list[Any], name: str) -> Record | None:
    """'the list Trainer.history stores bytearray objects of about 195.3 KiB each': what the code keeps in
    a container, from its newest items ('' when there are none)."""
    if not items or container is None:
        return None
    if any(_has_graph(item) for item in items):
        what = msg("graph_tensors")
    else:
        kind = Counter(describe_item(item) for item in items).most_common(1)[0][0]
        size = sum(map(item_bytes, items)) / len(items)
        what = msg("objects_of_size", kind=kind, size=size)
    return msg("stores", kind=type(container).__name__, holder=name, what=what)


def describe_item(item: Any) -> str:
    """'numpy.ndarray float32[256,256]', 'bytearray': an item's type, and for arrays its dtype and shape."""
    kind = type_name(type(item))
    shape, dtype = getattr(item, "shape", None), getattr(item, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:
        return f"{kind} {str(dtype).removeprefix('torch.')}[{','.join(map(str, shape))}]"
    return kind


def container_location(watchlist: Watchlist, metric: str, origins: ContainerOrigins | None) -> str | None:
    """'Trainer.history (train.py:42)': a watched container, placed at the line of the user's code that
    stores into it: the one around where its new items were made (their allocation tracebacks, the
    innermost user frame first, most often found first); else a line of its owner's class that stores
    into it; else the line that made its new items. None when nothing is known (the spec's `where`)."""
    watched = watchlist.watched(metric)
    if watched is None:
        return None
    attr = watched.attr or (watched.name if watched.name.isidentifier() else None)
    stacks = origins.stacks.get(metric, []) if origins else []
    sites: Counter[tuple[str, int]] = Counter()
    for stack in stacks if attr else ():
        found = next(((file, line) for file, lineno in stack if (line := storing_near(file, lineno, attr))), None)
        if found:
            sites[found] += 1
    if not sites and attr and watched.owner is not None:
        region = class_region(watched.owner)
        line = storing_line(*region, attr) if region else None
        if line is not None:
            sites[(region[0], line)] += 1
    if not sites:
        sites.update(stack[0] for stack in stacks)
    if not sites:
        return None
    file, line = sites.most_common(1)[0][0]
    return f"{watched.name} ({short_path(file)}:{line})"


def _grown_containers(ev: Evidence, accepted: list[Finding]) -> list[tuple[str, int]]:
    """Watched containers and gauges to judge, with the items each gained in the window: the suspects;
    and, when resident memory is a suspect nothing explains yet, any other that grew between the ladders
    (each series raises its suspicion on its own windows, so a list of arrays can make resident memory
    suspect first: named by its length, as when its length is suspect first, it is one finding), also when
    a finding before explains resident memory without having measured its growth (a second leak)."""
    unexplained = ev.unexplained(accepted)
    grown = [(m, int(ev.growth(m))) for m in unexplained if ev.specs[m].source in ("gauge", "container")]
    if "rss_bytes" in ev.unaccounted(accepted):
        others = (m for m, spec in ev.specs.items() if spec.source == "container" and m not in ev.suspects)
        grown += [(m, gained) for m in others if (gained := int(ev.growth(m))) >= 1]
    return grown


def _numbers(items: list[Any]) -> bool:
    """Plain numbers only (a loss history of floats, a list of step counts)."""
    return bool(items) and all(isinstance(item, numbers.Number) for item in items)


def _costs_something(ev: Evidence, metric: str, held: float, history: bool = False) -> bool:
    """A count that grows is a leak when what it holds is material in bytes over the horizon (a gauge's
    items are unknown: resident memory's growth stands for them, its trend or what the window's ladders
    saw it keep, the larger: a trend fit from before the gauge's onset is too low), or when step time
    rises with it (a collection walked every step: the Burn case), unless it is a `history` of plain
    numbers: walking one number a step more cannot make a step a fifth slower, and a step that got
    slower while a loss history grew was slowed by something else (a busy machine)."""
    if not history and slows_the_step(ev):
        return True
    rss = ev.specs.get("rss_bytes")
    if ev.specs[metric].unit == "bytes":  # a gauge of bytes (unit="bytes") measures what it holds itself
        per_step = max(ev.rate(metric), ev.growth(metric) / ev.steps)
        return is_material("bytes", per_step, ev.begin.after(metric) or 0.0, ev.horizon, rss.limit if rss else None)
    level = ev.begin.after("rss_bytes") or 0.0
    if ev.specs[metric].source == "gauge" and not held:
        trend = ev.trends.get("rss_bytes")
        slope = max(trend.slope, 0.0) if trend is not None and trend.growing else 0.0
        per_step = max(slope, ev.kept("rss_bytes") / ev.steps)
    else:
        per_step = held / ev.steps
    return is_material("bytes", per_step, level, ev.horizon, rss.limit if rss else None)


def _holds_the_rss_growth(ev: Evidence, held: float) -> bool:
    """Do a container's new items account for resident memory's growth? Judged on the window's growth
    when resident memory was a suspect too, else on its trend so far (it may not be significant yet, and
    would be reported again as python_objects at the line that appends)."""
    if held <= 0:
        return False
    if "rss_bytes" in ev.confirmed:
        return held >= 0.3 * ev.growth("rss_bytes")
    trend = ev.trends.get("rss_bytes")
    return trend is not None and held >= 0.3 * max(trend.slope, 0.0) * ev.steps


def slows_the_step(ev: Evidence) -> bool:
    """Has the CPU time per step grown by SLOWER of itself over the windows its trend spans (the Burn
    case: a collection walked every step), at the low end of its slope's confidence interval, and at
    the slope fitted over all of them (the interval comes from the latest scale, the span from all)? A
    significant trend alone is not enough: on a busy machine the step's CPU time drifts up by a few
    percent (caches and memory bandwidth shared with others), and a neighbour's load that changes once
    lifts it in one step, whose slope estimate can reach a fifth while its interval reaches far lower."""
    trend = ev.trends.get("step_cpu_seconds")
    return trend is not None and trend.growing and \
        min(trend.slope, trend.slope_low) * trend.span >= SLOWER * trend.first > 0


def step_time_note(ev: Evidence) -> Record | None:
    """'; CPU time per step rising ...' when the CPU time per step grows (the Burn case: a collection walked
    every step)."""
    if not slows_the_step(ev):
        return None
    return msg("cpu_rising", rate=ev.trends["step_cpu_seconds"].slope)


def garbage_cycles(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Memory that only gc.collect() takes back: reference cycles outpace the garbage collector. Placed
    where the cycles' objects are made (the closure that refers back, else the object), from the gc
    cycle census; else at the allocation site that grew most. While the collector runs on its own, the
    garbage (objects it had promoted before they became garbage) waits for its next full collection,
    which comes: a note, not a leak (a Keras fit on JAX leaves ~100 KiB of such cycles a batch), and
    nothing for gc_collect to do, whose periodic collections are of the young generations."""
    found = []
    for metric in ev.unexplained(accepted):
        if ev.specs[metric].unit != "bytes" or ev.survives(metric) or ev.reclaimed_by(metric) != "gc_collect":
            continue
        if collector_on():
            ev.note(metric, msg("collector_on", growth=ev.describe(metric)))
            continue
        growth, cycles = ev.reports.get("tracemalloc"), ev.reports.get("gc_cycles")
        made = cycles.sites[0][1] if cycles and cycles.sites else None
        found.append(ev.finding(
            "python_objects", metric, reclaimed_by="gc_collect",
            location=made or (growth.top.location if growth and growth.top else None),
            evidence=msg("cycles_pile_up", growth=ev.describe(metric),
                         census=msg("cycle_census", garbage=[{"type": t, "site": at, "count": n} for t, at, n in cycles.sites[:3]]) if made
                         else _types(ev)),
            recommendation=msg("break_cycles"),
        ))
    return found


def python_objects(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Resident memory that survives cleanup and that traced Python allocations account for (less the
    cyclic garbage the gc cycle census found at their site): a good part of the window's growth, or of
    what the suspicion's pace predicts for it, whichever is less (a window that also holds a warm-up's
    growth, a Keras fit's first compiles, grows far more than the leak), less what the findings before
    measured. Another finding on resident memory that did not measure its bytes
    (a list of losses kept with their graphs) does not hide this one: the allocation site is its own proof,
    its line its own place, its bytes its own rate."""
    metric = "rss_bytes"
    sites = _kept_sites(ev.reports.get("tracemalloc"), ev.reports.get("gc_cycles"))
    if metric not in ev.unaccounted(accepted) or not ev.survives(metric) or not sites:
        return []
    site = sites[0]
    if site.size < 0.3 * ev.unmeasured(metric, accepted) or \
            any(f.where == site.location for f in accepted if metric in f.explains):
        return []
    return [ev.finding(
        "python_objects", metric, location=site.location, accounts={metric: float(site.size)},
        evidence=msg("allocations_survived", growth=ev.describe(metric), size=site.size, count=site.count,
                     site=site.location, types=_types(ev)),
        recommendation=msg("find_who_holds", site=site.location),
    )]


def _kept_sites(growth: AllocationGrowth | None, cycles: Cycles | None) -> list[Site]:
    """The allocation sites that grew, less the cyclic garbage allocated there (it waits for a collection,
    it is not kept), the user's first, then the largest."""
    garbage = cycles.garbage if cycles else {}
    sites = growth.sites if growth else []
    return _ranked(dataclasses.replace(s, size=s.size - garbage.get(s.location, 0)) for s in sites)


def integration(watchlist: Watchlist) -> Integration:
    """Python probes, forensics, the gc rung and the Python rules."""
    return Integration(
        name="python",
        probes=[watchlist, watchlist.gauges],
        # ended in reverse: the cycles and the containers' items while tracemalloc still traces
        forensics=[TypeCensus(), AllocationDiff(), ContainerSites(watchlist), CycleCensus()],
        cleanups=[Cleanup("gc_collect", gc.collect)],
        rules=[container_rule(watchlist), Rule(55, garbage_cycles), Rule(80, python_objects)],
    )
