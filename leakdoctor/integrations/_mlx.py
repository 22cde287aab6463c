"""MLX knowledge: allocator probes, the lazy-graph and compile forensics, the cache-clear rung, and the
rules for MLX's three failure modes.

MLX is lazy: an operation records a graph node and computes nothing until something is evaluated. So
  * a loop that never evaluates the model and optimizer state chains every update onto the last: the
    graph (native memory, RSS) grows while the allocator's active memory stays flat, and the whole
    history is computed at once, in a spike, when something finally evaluates it (lazy_graph);
  * a metric accumulated without evaluation (`total = total + loss`) keeps every step's inputs alive:
    active memory and RSS grow (lazy_graph, named after the variable);
  * the buffer cache keeps freed buffers for reuse; with varying shapes it keeps one of every size up
    to the cache limit, so cache memory grows while active memory is flat (allocator_cache, benign);
  * `mx.compile` traces a function again for every new input shape and keeps each graph
    (compile_cache).
MLX has no counter of compile traces. A cache hit runs no Python at all and a trace runs the
function's Python body exactly once, so a profile hook that watches for entries into the compiled
functions' code objects sees every trace. Always on, it waits between two samples for the first such
entry and then removes itself (a compiled loop runs little Python between steps, so it costs next to
nothing, and the trace itself runs at full speed); during an investigation it counts every trace with
the shapes of its arguments, which name what changes (TraceSentinel).
"""

from __future__ import annotations

import ast
import reprlib
import sys
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Iterator, Mapping

from leakdoctor._base.evidence import Evidence, Rule
from leakdoctor._base.findings import Finding
from leakdoctor._base.messages import Record, msg
from leakdoctor._base.integration import Cleanup, Integration
from leakdoctor._base.metric import FunctionProbe, MetricSpec
from leakdoctor._base.source import caller_frame, frame_locals, frame_location, short_path, source_line
from leakdoctor._base.units import format_value
from leakdoctor.integrations._holders import Holder, find_holders, live_instances
from leakdoctor._reading.pacing import Pacer

ACTIVE, CACHE, PEAK = "mlx_active_bytes", "mlx_cache_bytes", "mlx_peak_bytes"
RSS = "rss_bytes"
STATE = "model.parameters(), optimizer.state"


def core() -> Any:
    """mlx.core, or an ImportError that says how to install it."""
    try:
        import mlx.core as mx
    except ImportError as err:
        raise ImportError("leakdoctor's MLX support needs mlx: pip install leakdoctor[mlx]") from err
    return mx


# --- cheap probe -----------------------------------------------------------------------------------

def memory_probe(limit: float | None) -> FunctionProbe:
    """Active, cache and peak memory of MLX's allocator: three counter reads, about a microsecond."""
    mx = core()
    active, cache, peak = mx.get_active_memory, mx.get_cache_memory, mx.get_peak_memory
    limit = limit or float(mx.get_memory_limit())
    specs = {
        ACTIVE: MetricSpec(ACTIVE, "bytes", limit=limit, source="mlx", where="mx.get_active_memory()"),
        CACHE: MetricSpec(CACHE, "bytes", limit=limit, source="mlx", where="mx.get_cache_memory()"),
        PEAK: MetricSpec(PEAK, "bytes", role="supporting", limit=limit, source="mlx", where="mx.get_peak_memory()"),
    }
    return FunctionProbe("mlx_memory", lambda: {ACTIVE: float(active()), CACHE: float(cache()), PEAK: float(peak())},
                         specs)


# --- where the user's loop is ----------------------------------------------------------------------

def _key(name: str) -> str:
    """The name an assignment to this variable mentions: `total`, `metrics` for metrics['loss'],
    `total` for self.total."""
    return name.split("[", 1)[0].split(".")[-1]


def _calls_of(name: str) -> Callable[[ast.AST], bool]:
    """A call of the function `name` (`step(X, y)`)."""
    return lambda node: isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _nested_function(code: Any, line: int) -> Any | None:
    """The code of the function defined inside `code` whose body holds `line`, if any."""
    for const in code.co_consts:
        if hasattr(const, "co_lines"):
            lines = [n for _, _, n in const.co_lines() if n is not None]
            if lines and const.co_firstlineno <= line <= max(lines):
                return const
    return None


def _updates(names: set[str]) -> Callable[[ast.AST], bool]:
    """A call `<name>.update(...)` or `self.<name>.update(...)` for one of the optimizers' names."""
    def wanted(node: ast.AST) -> bool:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"):
            return False
        owner = node.func.value
        return (isinstance(owner, ast.Name) and owner.id in names) or \
            (isinstance(owner, ast.Attribute) and owner.attr in names)

    return wanted


def _names_of(names: dict[str, Any], objects: tuple) -> set[str]:
    """Names under which the loop holds these objects: its locals, and attributes of `self`."""
    ids = {id(o) for o in objects}
    scopes = (names, getattr(names.get("self"), "__dict__", {}))
    return {name for scope in scopes for name, value in list(scope.items()) if id(value) in ids}


def _accumulates(key: str) -> Callable[[ast.AST], bool]:
    """An assignment to `key` (a variable, an item of it, or an attribute so named) that reads it too."""
    def mentions(node: ast.AST) -> bool:
        return any((isinstance(n, ast.Name) and n.id == key) or (isinstance(n, ast.Attribute) and n.attr == key)
                   for n in ast.walk(node))

    def wanted(node: ast.AST) -> bool:
        if isinstance(node, ast.AugAssign):
            return mentions(node.target)
        if isinstance(node, ast.Assign):
            return any(mentions(t) for t in node.targets) and mentions(node.value)
        return False

    return wanted


# --- forensic: lazy chains -------------------------------------------------------------------------

def is_evaluated(*trees: Any) -> bool:
    """Do all arrays in these trees hold data? Never evaluates anything."""
    mx = core()
    if hasattr(mx, "get_array_buffer_size"):  # recent MLX: a C++ walk that raises on a lazy array
        try:
            mx.get_array_buffer_size(*trees)
            return True
        except ValueError:
            return False
    return graph_edges(*trees) == 0


def arrays_of(trees: list[Any]) -> list[Any]:
    """The arrays in these trees (dicts, lists, modules), as a list."""
    from mlx.utils import tree_flatten

    array = core().array
    return [v for tree in trees for _, v in tree_flatten(tree) if isinstance(v, array)]


def graph_edges(*trees: Any) -> int:
    """Edges of the unevaluated graph behind these arrays (export_to_dot walks it without computing)."""
    sink = _EdgeCount()
    core().export_to_dot(sink, *arrays_of(list(trees)))
    return sink.edges


class _EdgeCount:
    """A file for export_to_dot that only counts the edges written to it."""

    edges = 0

    def write(self, text: str) -> None:
        self.edges += text.count("->")


@dataclass(frozen=True)
class Chain:
    """An unevaluated graph that chains across steps: the model and optimizer state (`holders`, which
    force_eval evaluates), or a variable of the loop (`name`, graph size `edges`)."""

    name: str
    location: str
    state: bool
    edges: int | None = None
    holders: tuple = field(default=(), compare=False, repr=False)
    step: str | None = None  # the function of the loop whose call updates the state (at `location`)


def state_trees(holders: tuple) -> list[Any]:
    """The arrays to evaluate for each holder: a module's parameters, an optimizer's state."""
    trees = []
    for obj in holders:
        if callable(getattr(obj, "parameters", None)):
            trees.append(obj.parameters())
        elif hasattr(obj, "state"):
            trees.append(obj.state)
    return trees


class LazyChains:
    """Finds unevaluated graphs that chain across steps. The model and optimizer state: not evaluated
    at the start of the window, still not one step later (so nothing in the loop evaluates it), and not
    at the end. Otherwise the loop's array variables (locals, dict values, attributes of `self`): one
    whose graph gained at least an edge per step of the window (`total = total + loss`,
    `metrics[k] += v`). Variables are looked at only when the state is evaluated: a lazy state makes
    everything computed from it lazy too. Arrays are held for one step at most, while the loop's own
    graph holds them anyway, and graph sizes are counted, not kept."""

    name = "mlx_lazy"
    max_variables = 64

    def __init__(self, model: Any = None, optimizer: Any = None) -> None:
        self._given = tuple(o for o in (model, optimizer) if o is not None)
        self._holders_seen: tuple = ()
        self._held: list[Any] | None = None
        self._lazy_state = False
        self._variables: dict[str, int] = {}

    def begin(self) -> None:
        frame = caller_frame()
        names = frame_locals(frame) if frame is not None else {}
        self._holders_seen = self._holders(names)
        trees = state_trees(self._holders_seen)
        self._held = arrays_of(trees) if trees and not is_evaluated(*trees) else None  # a snapshot:
        # optimizer.state is a dict the optimizer refills in place
        self._lazy_state = False
        self._variables = {} if self._held else \
            {n: graph_edges(a) for n, a in self._arrays(names) if not is_evaluated(a)}

    def baseline(self) -> None:
        """One step after `begin`: had the loop evaluated the state it left unevaluated? Releases it."""
        if self._held is not None:
            self._lazy_state = not is_evaluated(*self._held)
            self._held = None

    def end(self, steps: int) -> list[Chain]:
        self.baseline()  # if the window ended before its second step
        frame = caller_frame()
        holders, lazy_state, variables = self._holders_seen, self._lazy_state, self._variables
        self._holders_seen, self._lazy_state, self._variables = (), False, {}
        if frame is None:
            return []
        names = frame_locals(frame)
        if lazy_state:
            if is_evaluated(*state_trees(holders)):
                return []
            optimizers = tuple(h for h in holders if not callable(getattr(h, "parameters", None)))
            line = source_line(frame.f_code, _updates(_names_of(names, optimizers)))
            step = _nested_function(frame.f_code, line) if line is not None else None
            if step is not None:  # the update is in a step function the loop calls (mlx-examples: mx.compile'd)
                line = source_line(frame.f_code, _calls_of(step.co_name)) or line
            return [Chain(STATE, frame_location(frame, line), True, holders=holders,
                          step=step.co_name if step is not None else None)]
        current = dict(self._arrays(names))
        chains = []
        for name, before in variables.items():
            now = current.get(name)
            edges = graph_edges(now) if now is not None and not is_evaluated(now) else 0
            if edges - before >= steps:
                line = source_line(frame.f_code, _accumulates(_key(name)))
                chains.append(Chain(name, frame_location(frame, line), False, edges))
        return sorted(chains, key=lambda c: -(c.edges or 0))

    def _holders(self, names: dict[str, Any]) -> tuple:
        """The model and optimizer given to the doctor, else those found among the loop's locals."""
        if self._given:
            return self._given
        import mlx.nn as nn
        import mlx.optimizers as optim

        return tuple(v for v in names.values() if isinstance(v, (nn.Module, optim.Optimizer)))[:8]

    def _arrays(self, names: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        """Named arrays of the loop, one level deep; at most `max_variables`."""
        array = core().array
        count = 0
        for name, value in names.items():
            if isinstance(value, dict) and not callable(getattr(value, "parameters", None)):  # not a Module
                items = ((f"{name}[{k!r}]", v) for k, v in value.items())
            elif name == "self":
                items = ((f"self.{k}", v) for k, v in getattr(value, "__dict__", {}).items())
            else:
                items = iter([(name, value)])
            for label, item in items:
                if isinstance(item, array):
                    yield label, item
                    count += 1
                    if count >= self.max_variables:
                        return


# --- forensic: arrays kept across steps ------------------------------------------------------------

@dataclass
class KeptArrays:
    """MLX arrays gained during the window, by 'dtype[shape]': (kind, count, bytes), most bytes first; who
    holds a sample of the new ones (integrations/_holders.py), those holding most first; and how many of
    that sample are unevaluated (each keeps its graph and the graph's inputs: a list of
    `mx.mean(model(X) == y)` keeps every batch and every step's parameters)."""

    rows: list[tuple[str, int, float]]
    holders: list[Holder] = field(default_factory=list)
    lazy: int = 0
    sampled: int = 0

    def top(self, n: int = 3) -> str:
        return ", ".join(f"+{count} {kind} ({format_value(size, 'bytes')})" for kind, count, size in self.rows[:n])

    def records(self, n: int = 3) -> list[dict[str, Any]]:
        """The kinds of arrays gained most: each one's kind, count and bytes."""
        return [{"arrays": kind, "count": count, "size": size} for kind, count, size in self.rows[:n]]


def _array_kind(array: Any) -> str:
    return f"{str(array.dtype).removeprefix('mlx.core.')}[{','.join(map(str, array.shape))}]"


class ArrayCensus:
    """Live MLX arrays (the garbage collector tracks them) by dtype and shape at the start and end of the
    window. Kinds that gained half an array a step or more are kept across steps; for a sample of the new
    ones it names the places of the user's program that hold them (the loop's variables, globals,
    attributes of its objects), as jax's LiveArrayDiff does: MLX has no counter of live arrays, and
    its active memory alone says nothing of who keeps them."""

    name = "mlx_arrays"
    #: New arrays whose holders are looked for.
    sample = 64

    def __init__(self, roots: tuple = ()) -> None:
        self._roots = roots
        self._before: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        self._old: dict[int, Any] = {}

    def begin(self) -> None:
        live = live_instances(core().array)
        self._before = _array_census(live)
        self._old = {id(a): weakref.ref(a) for a in live}

    def end(self, steps: int) -> KeptArrays:
        live = live_instances(core().array)
        counts, sizes = _array_census(live)
        counts.subtract(self._before[0])
        sizes.subtract(self._before[1])
        self._before = (Counter(), Counter())
        rows = sorted(((kind, n, float(sizes[kind])) for kind, n in counts.items() if n > 0), key=lambda r: -r[2])
        kept = {kind for kind, n, _ in rows if n >= max(2, steps // 2)}  # half an array a step, or more
        new = [a for a in live if _array_kind(a) in kept and not self._is_old(a)][-self.sample:]
        self._old = {}
        if not new:
            return KeptArrays(rows)
        holders = find_holders(new, list(self._roots), caller_frame())
        lazy = sum(not is_evaluated(a) for a in new)
        return KeptArrays(rows, holders, lazy, len(new))

    def _is_old(self, array: Any) -> bool:
        ref = self._old.get(id(array))
        return ref is not None and ref() is array


def _array_census(live: list[Any]) -> tuple[Counter[str], Counter[str]]:
    """Live arrays by 'dtype[shape]': how many, and how many bytes (of their data, once evaluated)."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for array in live:
        kind = _array_kind(array)
        counts[kind] += 1
        sizes[kind] += array.nbytes
    return counts, sizes


# --- compile traces: an always-on sentinel, and the investigation's full count ----------------------

TRACES = "mlx_compile_traces"
#: The fraction of time the sentinel may take, and the events after which it removes itself (a run that
#: ended, or a loop with much Python between steps, must not be slowed for long).
BUDGET = 0.005
MAX_EVENTS = 4096


@dataclass(frozen=True)
class Trace:
    """One trace of a compiled function: its name, where it is defined, and its arguments: shapes of the
    arrays, values of the rest (a Python constant that changes also retraces)."""

    name: str
    location: str
    args: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Traces:
    """How often each compiled function was traced during the window, most first, and the traces."""

    rows: list[tuple[str, str, int]]  # (name, location, traces)
    traces: list[Trace] = field(default_factory=list)

    def changing(self, name: str) -> str:
        """'x: (64, 16) to (71, 16), y: ...': the arguments of `name` that changed between its traces."""
        seen: dict[str, list[str]] = {}
        for trace in self.traces:
            if trace.name == name:
                for arg, value in trace.args:
                    seen.setdefault(arg, []).append(value)
        changed = [f"{arg} {values[0]} to {values[-1]} ({len(set(values))} different)"
                   for arg, values in seen.items() if len(set(values)) > 1]
        return ", ".join(changed)


class TraceSentinel:
    """Counts traces of the loop's mx.compile'd functions always, for what it costs. A cache hit of a
    compiled function runs no Python at all; a trace runs its Python body once. So between two samples a
    profile hook waits for a call into one of their code objects, counts it and removes itself at once
    (the trace then runs at full speed), or is removed at the next sample. In a compiled loop few Python
    calls happen between steps, so the hook costs next to nothing; where many do, it is set on fewer
    samples (each event of the loop's code, from the return of doctor.step on, at the cost measured once
    for an event, within BUDGET of the time between samples), and it removes itself after MAX_EVENTS. After
    an interval with a trace it watches the next one whatever the pacing: a loop that retraces every step
    pays a compile a step, and its count must not depend on how busy the machine is (paced on a loaded
    one, a trace a step read as 0.44). During an investigation (`full`) it stays set and counts every
    trace with its arguments' shapes. It never replaces a profiler the program set itself."""

    name = "mlx_traces"
    every = 1
    refresh = 64

    def __init__(self, budget: float = BUDGET) -> None:
        self._codes: dict[Any, None] = {}
        self._caller: Any = None  # the loop's frame, until doctor.step returns to it
        self._event_cost = 0.0
        self._reads = 0
        self._events = 0
        self.count = 0
        self.full: Traces | None = None  # the investigation's record, while it runs
        self._counts: dict[Any, int] = {}
        self._pacer = Pacer(budget, maximum=64)
        self._countdown = 0
        self._counted = 0  # the count at the last sample
        self._last = time.perf_counter()
        self._spec = MetricSpec(TRACES, "count", source="mlx", lower_bound=True)  # a trace a sample at most

    def read(self) -> Mapping[str, float]:
        now = time.perf_counter()
        hooked = self._unhook()
        if hooked and self.full is None:
            self._countdown = self._pacer.update(self._events * self._event_cost, now - self._last)
        if self.count > self._counted:  # a trace since the last sample: watch the next interval too
            self._countdown, self._counted = 0, self.count
        self._last = now
        if self._reads % self.refresh == 0:
            frame = caller_frame()
            self._codes = dict.fromkeys(compiled_codes(frame_locals(frame), frame.f_globals) if frame else ())
            self._event_cost = self._event_cost or (self._calibrate() if self._codes else 0.0)
        self._reads += 1
        if not self._codes:
            return {}
        self._countdown -= 1
        if self.full is not None or self._countdown <= 0:
            self._hook()
        return {TRACES: float(self.count)}

    def read_now(self) -> Mapping[str, float]:
        """The count as it stands, for the cleanup ladder (which reads after each rung, within one step):
        the hook and its pacing are left alone."""
        return {TRACES: float(self.count)} if self._codes else {}

    def spec(self, metric: str) -> MetricSpec:
        return self._spec

    def begin_full(self) -> None:
        """Count every trace, and its arguments, until `end_full`."""
        self.full, self._counts = Traces([]), {}

    def end_full(self) -> Traces | None:
        full, counts, self.full = self.full, self._counts, None
        if full is None or not counts:
            return None
        rows = [(c.co_name, f"{short_path(c.co_filename)}:{c.co_firstlineno}", n) for c, n in counts.items()]
        return Traces(sorted(rows, key=lambda r: -r[2]), full.traces)

    def _calibrate(self, calls: int = 500) -> float:
        """Seconds one profile event costs here (the least of three timings of calls to an empty function
        with the hook set and without), measured once, when there are compiled functions to watch."""
        if sys.getprofile() is not None:
            return 1e-6
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            _calls(calls)
            plain = time.perf_counter() - start
            sys.setprofile(self._event)
            start = time.perf_counter()
            _calls(calls)
            hooked = time.perf_counter() - start
            sys.setprofile(None)
            timings.append((hooked - plain) / (2 * calls))
        self._events = 0
        return max(min(timings), 1e-7)

    def _hook(self) -> None:
        if sys.getprofile() is None:
            self._events, self._caller = 0, caller_frame()
            sys.setprofile(self._event)

    def _unhook(self) -> bool:
        self._caller = None
        if sys.getprofile() == self._event:
            sys.setprofile(None)
            return True
        return False

    def _event(self, frame: Any, event: str, arg: Any) -> None:
        if self._caller is not None:  # the rest of doctor.step: its own calls are not the loop's to count
            if event == "return" and frame.f_back is self._caller:
                self._caller = None
            return
        self._events += 1
        if event == "call" and frame.f_code in self._codes:
            self.count += 1
            if self.full is not None:
                self._counts[frame.f_code] = self._counts.get(frame.f_code, 0) + 1
                self.full.traces.append(_trace(frame))
                return
            sys.setprofile(None)
        elif self._events > MAX_EVENTS and self.full is None:
            sys.setprofile(None)


def _nothing() -> None:
    pass


def _calls(n: int) -> None:
    for _ in range(n):
        _nothing()


def _trace(frame: Any) -> Trace:
    """The arguments a traced call received: shapes of arrays, short reprs of Python values."""
    code = frame.f_code
    values = frame.f_locals
    args = []
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        value = values.get(name)
        shape = getattr(value, "shape", None)
        args.append((name, str(tuple(shape)) if shape is not None else reprlib.repr(value)))
    return Trace(code.co_name, f"{short_path(code.co_filename)}:{code.co_firstlineno}", tuple(args))


class CompileTraces:
    """The investigation's count of traces: the sentinel counts every trace of the window, with the
    shapes of its arguments."""

    name = "mlx_compile"

    def __init__(self, sentinel: TraceSentinel) -> None:
        self._sentinel = sentinel

    def begin(self) -> None:
        self._sentinel.begin_full()

    def end(self, steps: int) -> Traces | None:
        return self._sentinel.end_full()


@lru_cache(maxsize=1)
def _compiled_type() -> type:
    return type(core().compile(_identity))


def compiled_codes(names: dict[str, Any], module: dict[str, Any]) -> set[Any]:
    """Code objects of the functions wrapped by mx.compile that the loop can reach by name: its locals,
    its module's globals, the attributes of `self`."""
    kind = _compiled_type()
    found = set()
    for scope in (names, module, getattr(names.get("self"), "__dict__", {})):
        for value in list(scope.values()):
            if isinstance(value, kind):
                found.add(value.__code__)
    return found


def _identity(x: Any) -> Any:
    return x


# --- rules -----------------------------------------------------------------------------------------

def _active(ev: Evidence) -> Record | None:
    """What MLX's active memory did during the window, for the evidence."""
    if ACTIVE in ev.confirmed:
        return msg("active_grew", growth=ev.growth(ACTIVE))
    start, stop = ev.begin.after(ACTIVE), ev.end.before(ACTIVE)
    if start is None or stop is None:
        return None
    return msg("active_flat", growth=stop - start, steps=ev.steps)


def lazy_graph(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Growth while an unevaluated graph chains across steps (see LazyChains)."""
    chains = ev.reports.get(LazyChains.name) or []
    open_metrics = ev.unexplained(accepted)
    if not chains:
        return []
    chain = chains[0]
    order = (RSS, ACTIVE) if chain.state else (ACTIVE, RSS)
    metric = next((m for m in order if m in open_metrics), None)
    if metric is None:
        return []
    explains = tuple(m for m in (ACTIVE, RSS) if m in open_metrics)
    if chain.state:
        return [ev.finding(
            "lazy_graph", metric, location=chain.location, explains=explains, subject=chain,
            evidence=msg("state_not_evaluated", growth=ev.describe(metric),
                         active=_active(ev) if metric == RSS else None, state=STATE, steps=ev.steps),
            recommendation=msg("eval_state_after_call", function=chain.step, state=STATE, site=chain.location)
            if chain.step else msg("eval_state_after_update", state=STATE, site=chain.location),
        )]
    names = [c.name for c in chains]
    expr, key = chain.name.split("[", 1)[0], _key(chain.name)
    return [ev.finding(
        "lazy_graph", metric, location=chain.location, explains=explains, subject=chain,
        evidence=msg("never_evaluated", growth=ev.describe(metric), names=names, edges=chain.edges,
                     name=chain.name),
        recommendation=msg("eval_chain", name=chain.name, state=STATE, expr=expr, key=key),
    )]


def kept_arrays(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Active memory that grows while a place of the user's program keeps more arrays every step (see
    ArrayCensus): lazy_graph when the kept arrays are unevaluated (each holds its graph and the graph's
    inputs: a list of accuracies appended without .item() keeps every batch and every step's
    parameters), device_arrays otherwise. On MLX's active memory, explaining resident memory too when
    the active memory's growth makes a good part of it (on CPU the arrays live in the process's heap);
    placed at the line that stores into the holder."""
    census: KeptArrays | None = ev.reports.get(ArrayCensus.name)
    open_metrics = ev.unexplained(accepted)
    if census is None or not census.holders or ACTIVE not in open_metrics or not ev.survives(ACTIVE):
        return []
    holders = [h for h in census.holders if 2 * h.count >= census.holders[0].count][:3]
    holder = holders[0]
    # of resident memory's growth, what the suspicion predicts where the window grew more (the window may
    # also hold what an investigation's own tracing costs), as the JAX rule weighs it
    rss = RSS in open_metrics and ev.growth(ACTIVE) >= 0.3 * min(ev.growth(RSS), ev.expected(RSS)) > 0
    explains = (ACTIVE, *([RSS] if rss else []))
    location = holder.location(ev.reports.get("tracemalloc"))
    held = msg("sampled_held_by", sampled=census.sampled,
               holders=[{"holder": h.name, "count": h.count} for h in holders])
    kinds = msg("arrays_gained", arrays=census.records()) if census.rows else None
    growth = [ev.describe(ACTIVE), *([msg("also", growth=ev.describe(RSS))] if rss else [])]
    if census.lazy * 2 >= census.sampled:
        return [ev.finding(
            "lazy_graph", ACTIVE, location=location, explains=explains,
            evidence=msg("kept_lazy", growth=growth, kinds=kinds, held=held, lazy=census.lazy,
                         sampled=census.sampled),
            recommendation=msg("store_numbers_or_eval", holder=holder.path),
        )]
    return [ev.finding(
        "device_arrays", ACTIVE, location=location, explains=explains,
        evidence=msg("survived_cleanup", growth=growth, kinds=kinds, held=held),
        recommendation=msg("store_numbers", holder=holder.path),
    )]


def compile_cache(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """A compiled function traced again and again (see TraceSentinel): at least twice in the window, so
    retracing recurs rather than following one new shape. Always on the count of traces, the exact
    measure of the cause (as jax's compile_cache is on jax_compiles), explaining the memory that grew with
    it (each compiled graph is kept), which the evidence describes; named after the function, with the
    arguments whose shapes change. Memory or the count opens it; a function traced on every step of the
    window is a finding even when the investigation was opened by another metric (the buffer cache, which
    new shapes fill first): its compile cache grows by a graph a step, before any series shows it."""
    traces = ev.reports.get(CompileTraces.name)
    if traces is None or not traces.rows or traces.rows[0][2] < 2:
        return []
    name, where, count = traces.rows[0]
    open_metrics = ev.unexplained(accepted)
    every_step = count >= ev.steps and not ev.explained(TRACES, accepted)
    grown = [m for m in (RSS, ACTIVE) if m in open_metrics and ev.survives(m)]
    if not (grown or TRACES in open_metrics or every_step):
        return []
    metric = TRACES
    changing = traces.changing(name)
    memory = [msg("also", growth=ev.describe(m)) for m in (RSS, ACTIVE) if m in ev.confirmed]
    growth = ev.describe(metric) if metric in ev.suspects else msg("grew_by", metric=TRACES, count=count)
    finding = ev.finding(
        "compile_cache", metric, location=where, explains=tuple(dict.fromkeys((metric, *grown, RSS))),  # graphs kept
        evidence=msg("traced", growth=growth, memory=memory, function=name, count=count, steps=ev.steps,
                     changing=msg("arguments_changing", arguments=changing) if changing else None),
        recommendation=msg("shapeless", function=name),
    )
    # the sentinel counts at most a trace a sample; the window's full count is the rate
    return [replace(finding, rate_per_step=count / ev.steps, detected_rate=count / ev.steps, rate_interval=None)]


def buffer_cache(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Cache memory (or the resident memory holding it) that mx.clear_cache() took back: MLX's buffer
    cache holding freed buffers. Always on MLX's cache metric, the exact measure of the cause (which
    cap_cache looks for and is judged on), explaining the resident memory that held it too."""
    cached = [m for m in (CACHE, RSS) if m in ev.unexplained(accepted) and ev.reclaimed_by(m) == "clear_cache"]
    if not cached or CACHE not in ev.specs:
        return []
    return [ev.finding(
        "allocator_cache", CACHE, benign=True, reclaimed_by="clear_cache", explains=tuple(dict.fromkeys([CACHE, *cached])),
        evidence=msg("mlx_cache", growth=ev.describe(cached[0]), active=_active(ev)),
        recommendation=msg("cap_cache"),
    )]


def integration(model: Any = None, optimizer: Any = None, limit: float | None = None) -> Integration:
    """MLX probes, forensics, the cache-clear rung and rules. `limit` (bytes) overrides
    mx.get_memory_limit() as the limit of MLX's memory series."""
    mx = core()
    sentinel = TraceSentinel()
    targets = {k: v for k, v in (("model", model), ("optimizer", optimizer)) if v is not None}
    return Integration(
        name="mlx",
        probes=[memory_probe(limit), sentinel],
        forensics=[LazyChains(model, optimizer), CompileTraces(sentinel),
                   ArrayCensus(tuple(o for o in (model,) if o is not None))],
        cleanups=[Cleanup("clear_cache", mx.clear_cache)],
        rules=[Rule(20, lazy_graph), Rule(25, compile_cache), Rule(27, kept_arrays), Rule(30, buffer_cache)],
        targets=targets,
    )
