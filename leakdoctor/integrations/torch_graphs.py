"""Tensors that keep their autograd graph across steps: a census of the live tensors at the start and end
of an investigation, a finder that names who holds the ones kept (a model attribute, a local list, a
global) with the line that made them, and the retained_graph rule. Part of the PyTorch integration
(integrations/torch.py), apart because it is the one piece that walks the heap and the stack."""

from __future__ import annotations

import gc
import inspect
import sys
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from leakdoctor.diagnosis import Evidence
from leakdoctor.integrations import Rule
from leakdoctor.integrations.python import CONTAINERS, AllocationGrowth
from leakdoctor.integrations.source import frame_locals, is_user_file, short_path
from leakdoctor.summary import Finding, format_value

#: Most autograd nodes a census walks; a graph this large is reported as at least this large.
GRAPH_LIMIT = 200_000


@dataclass
class Holder:
    """Who keeps retained tensors: `path` ("val_losses", "LitModel.outputs", "global LOSSES") within
    `scope` (" in train()" for a local variable), the code region where to look for the line that made
    them, and access for detach_retained: `get` returns the live container or tensor; `rebind` replaces
    it where that is possible (attributes, globals; not a function's local variables)."""

    path: str
    scope: str
    count: int
    region: tuple[str, int, int]
    line: int
    get: Callable[[], Any]
    rebind: Callable[[Any], None] | None = None

    @property
    def name(self) -> str:
        return self.path + self.scope

    def location(self, allocations: AllocationGrowth | None) -> str:
        """'val_losses in train() (train.py:42)': the line inside the holder's code that gained the most
        live allocations during the investigation (one per kept tensor, every window alike), else where
        that code stands now."""
        path, first, last = self.region
        inside = []
        for site in allocations.sites if allocations else []:
            file, _, number = site.location.rpartition(":")
            if site.user and file == short_path(path) and first <= int(number) <= last:
                inside.append((-site.count, int(number)))
        line = min(inside)[1] if inside else self.line
        return f"{self.name} ({short_path(path)}:{line})"


@dataclass
class Retained:
    """What the tensor census saw over an investigation of `steps` steps: tensor groups (shape, dtype,
    device, graph) whose live count grew, autograd nodes gained, and who holds the retained tensors."""

    steps: int
    groups: list[tuple[str, int, int, bool]]  # (description, tensors gained, bytes gained, holds a graph)
    graph_growth: int
    holders: list[Holder]

    @property
    def retained(self) -> bool:
        return any(graph for *_, graph in self.groups) or self.graph_growth >= self.steps

    @property
    def graph_bytes(self) -> int:
        """Bytes of the tensors gained in the window that hold a graph (activations saved by the graphs)."""
        return sum(b for *_, b, graph in self.groups if graph)

    @property
    def devices(self) -> set[str]:
        return {desc.split()[-1].split(":")[0] for desc, *_, graph in self.groups if graph}

    def describe(self) -> str:
        kept = [f"{n} × {desc} ({format_value(b, 'bytes')})" for desc, n, b, graph in self.groups if graph]
        parts = [f"tensors with grad_fn kept across {self.steps} steps: {', '.join(kept[:3])}"] if kept else []
        if self.graph_growth >= self.steps:
            parts.append(f"autograd graph grew by {self.graph_growth} nodes")
        if self.holders:
            parts.append("held by " + ", ".join(f"{h.name} ({h.count})" for h in self.holders[:3]))
        return "; ".join(parts)

    def kept_on(self, device: str) -> str:
        kept = [f"{n} × {desc}" for desc, n, _, _ in self.groups if desc.split()[-1].startswith(device)]
        return f"tensors gained on {device}: {', '.join(kept[:3])}" if kept else ""


def live_instances(base: type) -> list[Any]:
    """Every live instance of `base`. The subclass test is made once per type: against torch's tensor metaclass it
    allocates, which tracemalloc (tracing during investigations) makes ten times slower."""
    is_instance: dict[type, bool] = {}
    found = []
    for obj in gc.get_objects():
        cls = type(obj)
        verdict = is_instance.get(cls)
        if verdict is None:
            verdict = is_instance[cls] = issubclass(cls, base)
        if verdict:
            found.append(obj)
    return found


def group_of(t: Any) -> tuple[str, bool]:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} {t.device}", t.grad_fn is not None


def graph_nodes(tensors: Sequence[Any], limit: int = GRAPH_LIMIT) -> int:
    """Distinct autograd nodes reachable from the tensors' grad_fn (the node wrappers are kept alive
    while walking, so their ids stay unique)."""
    seen: dict[int, Any] = {}
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(fn for fn, _ in node.next_functions)
    return len(seen)


class TensorCensus:
    """Live tensors by (shape, dtype, device, holds a graph) and autograd nodes, at the start and end of an
    investigation. Groups that gained at least half a tensor per step are kept across steps; if those hold
    a graph (or the graph grew by a node per step), the census names who holds them."""

    name = "tensor_census"

    def __init__(self, tensor_type: type, roots: Callable[[], list[Any]]) -> None:
        self._tensor = tensor_type
        self._roots = roots
        self._before: Counter[tuple[str, bool]] = Counter()
        self._graph = 0
        self._old: dict[int, Any] = {}

    def begin(self) -> None:
        tensors = live_instances(self._tensor)
        self._before = Counter(map(group_of, tensors))
        self._graph = graph_nodes(tensors)
        self._old = {id(t): weakref.ref(t) for t in tensors if t.grad_fn is not None}

    def end(self, steps: int) -> Retained:
        tensors = live_instances(self._tensor)
        keyed = [(group_of(t), t) for t in tensors]
        after = Counter(group for group, _ in keyed)
        gained = {g: n - self._before[g] for g, n in after.items() if n - self._before[g] >= max(2, steps // 2)}
        size = {group: t.element_size() * t.nelement() for group, t in keyed if group in gained}
        groups = sorted(((desc, n, n * size[(desc, graph)], graph) for (desc, graph), n in gained.items()),
                        key=lambda g: g[2], reverse=True)
        grad = [t for (_, graph), t in keyed if graph]
        growth = graph_nodes(grad) - self._graph
        kept = [t for group, t in keyed if group[1] and group in gained and not self._is_old(t)]
        frame = sys._getframe(1)
        holders = find_holders(kept, self._roots(), frame) if kept else []
        if not holders and growth >= steps and grad:  # a running total chains each step's graph to the last
            biggest = max(grad, key=lambda t: graph_nodes([t], limit=growth + 1))
            holders = find_holders([biggest], self._roots(), frame)
        self._before, self._old = Counter(), {}
        return Retained(steps, groups, growth, holders)

    def _is_old(self, t: Any) -> bool:
        ref = self._old.get(id(t))
        return ref is not None and ref() is t


def find_holders(tensors: Sequence[Any], roots: Sequence[Any], frame: Any) -> list[Holder]:
    """Who holds `tensors`: attributes of the root modules (and of user objects they hold), then local
    variables and globals of the user's frames on the stack. Most tensors first; each container once."""
    ids = {id(t) for t in tensors}
    holders: dict[int, Holder] = {}
    for path, scope, value, origin, get, rebind in places(roots, frame):
        count = _holds(value, ids, depth=2)
        if count and id(value) not in holders:
            region, line = _region(origin)
            holders[id(value)] = Holder(path, scope, count, region, line, get, rebind)
    return sorted(holders.values(), key=lambda h: h.count, reverse=True)


#: (path, scope, value, origin: the owner's class or the frame, get, rebind) of a place that may hold tensors.
Place = tuple[str, str, Any, Any, Callable[[], Any], "Callable[[Any], None] | None"]


def places(roots: Sequence[Any], frame: Any) -> Iterator[Place]:
    """Every place the user's program keeps things: attributes of the root modules, then the variables of
    the user's frames from `frame` outwards (and attributes of the user's objects among them), and their
    modules' globals."""
    for root in roots:
        for module in root.modules():
            for path, value, get, rebind in _attributes(module, type(module).__qualname__, depth=2):
                yield path, "", value, type(module), get, rebind
    seen_globals: set[int] = set()
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            if frame.f_code.co_name != "<module>":
                yield from _locals(frame)
            if id(frame.f_globals) not in seen_globals:
                seen_globals.add(id(frame.f_globals))
                yield from _globals(frame)
        frame = frame.f_back


def _locals(frame: Any) -> Iterator[Place]:
    """A function's local variables (and the attributes of user objects among them). A local variable
    cannot be rebound from outside: the remedy changes its value in place."""
    scope = f" in {frame.f_code.co_name}()"
    for name, value in frame_locals(frame).items():
        yield name, scope, value, frame, _getter(value), None
        for path, inner, get, rebind in _attributes(value, name, depth=1):
            yield path, scope, inner, frame, get, rebind


def _globals(frame: Any) -> Iterator[Place]:
    namespace = frame.f_globals
    for name, value in list(namespace.items()):
        yield (f"global {name}", "", value, namespace, lambda n=name: namespace.get(n),
               lambda v, n=name: namespace.__setitem__(n, v))


def _region(origin: Any) -> tuple[tuple[str, int, int], int]:
    """The code region of a class, a running function (frame) or a module (its globals), and the line to
    name when no allocation site is known."""
    if isinstance(origin, dict):
        return (origin.get("__file__") or "?", 1, sys.maxsize), 1
    if inspect.isframe(origin):
        code = origin.f_code
        last = max((line for *_, line in code.co_lines() if line), default=code.co_firstlineno)
        return (code.co_filename, code.co_firstlineno, last), origin.f_lineno
    try:
        lines, first = inspect.getsourcelines(origin)
        return (inspect.getsourcefile(origin) or "?", first, first + len(lines)), first
    except (OSError, TypeError):
        return ("?", 0, 0), 0


def _attributes(obj: Any, path: str, depth: int) -> Iterator[tuple[str, Any, Callable[[], Any], Callable[[Any], None]]]:
    """(path, value, get, rebind) of the attributes of a module or of an instance of a user's class, and
    of such objects among them, `depth` levels deep."""
    if not _searchable(obj):
        return
    ref = weakref.ref(obj)
    for attr, value in list(vars(obj).items()):
        name = f"{path}.{attr}"
        yield name, value, lambda a=attr: getattr(ref(), a, None), lambda v, a=attr: setattr(ref(), a, v)
        if depth > 1:
            yield from _attributes(value, name, depth - 1)


def _searchable(obj: Any) -> bool:
    """Modules and instances of classes from the user's code that have a __dict__ and take weakrefs."""
    if not hasattr(obj, "__dict__") or inspect.isclass(obj) or inspect.ismodule(obj) or inspect.isroutine(obj):
        return False
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    module = sys.modules.get(type(obj).__module__)
    return hasattr(obj, "named_modules") or is_user_file(getattr(module, "__file__", None) or "<unknown>")


def _getter(value: Any) -> Callable[[], Any]:
    """Access to a local variable's value after its frame moved on: tensors are referenced weakly, and
    containers (which cannot be) strongly."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


def _holds(value: Any, ids: set[int], depth: int) -> int:
    """How many of the tensors (by id) `value` is or holds, looking `depth` containers deep."""
    if id(value) in ids:
        return 1
    if depth == 0 or not isinstance(value, CONTAINERS):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return sum(_holds(item, ids, depth - 1) for item in items)


def retained_rule() -> Rule:
    """Tensors that hold their autograd graph kept across steps: name the holder and the line that makes
    them. The finding is on memory (device memory first) where it grows with the graphs: that is what
    leaks, what detach_retained frees and what it is judged on. A watched container that holds them (a
    list on the module) grows too: the finding explains its length, and is on that length when the
    graphs' tensors do not account for the memory growth (a loss kept after backward() keeps only the
    graph's nodes: the list is the problem, and only the user can bound it)."""

    def retained_graph(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        census = ev.reports.get("tensor_census")
        if census is None or not census.retained:
            return []
        unexplained = ev.unexplained(accepted)
        holder = census.holders[0] if census.holders else None
        containers = [m for m, spec in ev.specs.items() if holder and spec.source == "container"
                      and (spec.where or "").split(" (")[0] == holder.name and _grows(ev, m)]
        candidates = [f"{d}_allocated_bytes" for d in ("cuda", "mps") if d in census.devices] + ["rss_bytes"]
        memory = next((m for m in candidates if m in unexplained
                       and (ev.survives(m) or _graphs_account(ev, m, census))), None)
        on_memory = memory is not None and (not containers or _graphs_account(ev, memory, census))
        metric = memory if on_memory else next(iter(containers), None)
        if metric is None:
            return []
        twin = [memory.replace("allocated", "reserved")] if memory and memory.endswith("_allocated_bytes") else []
        allocations = ev.reports.get("tracemalloc")
        top = allocations.top if allocations else None
        location = holder.location(allocations) if holder else top.location if top else None
        name = holder.path if holder else "the kept tensors"
        if holder is None or isinstance(holder.get(), CONTAINERS):
            advice = (f"store loss.detach() or loss.item() in {name}, not the tensor with its autograd graph (or "
                      f"compute it under torch.no_grad()), and clear {name} once it is used")
        else:
            advice = (f"add loss.detach() or loss.item() to {name}, not the tensor with its autograd graph (or "
                      f"compute it under torch.no_grad())")
        growth = "; ".join(_describe(ev, m) for m in dict.fromkeys([metric, *containers]))
        return [ev.finding(
            "retained_graph", metric, location=location,
            explains=tuple(dict.fromkeys([metric, *containers, *([memory] if memory else []), *twin])),
            subject=census.holders, evidence=f"{growth}; {census.describe()}",
            recommendation=advice)]

    return Rule(30, retained_graph)


def _graphs_account(ev: Evidence, metric: str, census: Retained) -> bool:
    """Do the kept graphs account for the growth of `metric`: it grew (a suspect that survived the ladder,
    or that a rung partly took back, since the C heap fragments around kept tensors and malloc_trim
    returns that; or a metric that is no suspect but trends up), and the tensors the graphs gained in
    the window make at least a quarter of that growth?"""
    trend = ev.suspects.get(metric) or ev.trends.get(metric)
    grew = ev.growing(metric) if metric in ev.suspects else bool(trend and trend.growing)
    return grew and trend is not None and census.graph_bytes >= 0.25 * trend.slope * ev.steps


def _describe(ev: Evidence, metric: str) -> str:
    """How the metric grew: over the window, or (no suspect of this investigation) by its trend."""
    if ev.growing(metric):
        return ev.describe(metric)
    unit = ev.specs[metric].unit if metric in ev.specs else "count"
    return f"{metric} growing by {format_value(ev.rate(metric), unit)}/step"


def _grows(ev: Evidence, metric: str) -> bool:
    """Growing now, or known to grow (a metric an earlier finding explains is no longer investigated)."""
    trend = ev.trends.get(metric)
    return metric in ev.confirmed or bool(trend and trend.growing)
