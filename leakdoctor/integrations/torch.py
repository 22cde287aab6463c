"""PyTorch knowledge: what to read every sample, what to look at when memory grows, how to name the cause.

Probes (cheap): CUDA/MPS allocated and reserved bytes and CUDA's allocation retries (only where the device
exists and the program uses it), and the number of hooks on the model's modules.
Forensic (escalation only): a tensor census that compares the live tensors at the start and end of an
investigation and names who keeps the ones that hold an autograd graph (a model attribute, a local
list, a global), with the line where they were made.
Rules: hook_accumulation, retained_graph, the device allocator (allocator_cache or device_arrays) and
dataloader_workers naming the dataset's Python container. Cleanup: the device cache clear, "clear_cache".
"""

from __future__ import annotations

import gc
import inspect
import sys
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from leakdoctor.diagnosis import Evidence
from leakdoctor.integrations import Cleanup, Integration, MetricSpec, Rule
from leakdoctor.integrations.python import CONTAINERS, AllocationGrowth, code_location, is_user_file, short_path
from leakdoctor.integrations.python import _step_time
from leakdoctor.summary import Finding, format_value

HOOKS = "torch_hooks"
#: Module attributes that hold hooks, and what to call their hooks.
HOOK_DICTS = {
    "_forward_hooks": "forward hook",
    "_forward_pre_hooks": "forward pre-hook",
    "_backward_hooks": "backward hook",
    "_backward_pre_hooks": "backward pre-hook",
    "_state_dict_hooks": "state_dict hook",
    "_state_dict_pre_hooks": "state_dict pre-hook",
    "_load_state_dict_pre_hooks": "load_state_dict pre-hook",
    "_load_state_dict_post_hooks": "load_state_dict post-hook",
}
#: Flags keyed by the same handle id, removed with the hook (as RemovableHandle.remove does).
HOOK_EXTRAS = {"_forward_hooks": ("_forward_hooks_with_kwargs", "_forward_hooks_always_called"),
               "_forward_pre_hooks": ("_forward_pre_hooks_with_kwargs",)}
#: Most autograd nodes a census walks; a graph this large is reported as at least this large.
GRAPH_LIMIT = 200_000
#: Items from which a dataset's Python container is named as what DataLoader workers copy.
MANY_ITEMS = 1000


def require_torch() -> Any:
    """The torch module, or an ImportError that says what to install."""
    try:
        import torch
    except ImportError as err:
        raise ImportError("leakdoctor's PyTorch support needs torch: pip install leakdoctor[torch]") from err
    return torch


def unwrap(model: Any) -> Any:
    """The user's module inside DataParallel/DistributedDataParallel (.module) or torch.compile (._orig_mod)."""
    torch = require_torch()
    while True:
        if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def gather(obj: Any) -> list[Any] | None:
    """Every rank's `obj` (picklable), in rank order, when torch.distributed runs several ranks; else None."""
    dist = require_torch().distributed
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def distributed_rank() -> int | None:
    """This process's rank when torch.distributed is initialized, else None."""
    dist = require_torch().distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


# --- device memory --------------------------------------------------------------------------------

class CudaProbe:
    """Allocated and reserved bytes of the current CUDA device, and the caching allocator's retries
    (cudaMalloc failed, the cache was flushed, the allocation tried again: fragmentation). One
    memory_stats() call per read; nothing is read before the program itself initialises CUDA."""

    name = "cuda"
    every = 1

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda

    def read(self) -> Mapping[str, float]:
        if not self._cuda.is_initialized():
            return {}
        stats = self._cuda.memory_stats()
        return {"cuda_allocated_bytes": float(stats.get("allocated_bytes.all.current", 0)),
                "cuda_reserved_bytes": float(stats.get("reserved_bytes.all.current", 0)),
                "cuda_alloc_retries": float(stats.get("num_alloc_retries", 0))}

    def spec(self, metric: str) -> MetricSpec:
        if metric == "cuda_alloc_retries":
            return MetricSpec(metric, "count", role="supporting", source="cuda")
        device = self._cuda.current_device()
        limit = float(self._cuda.get_device_properties(device).total_memory)
        return MetricSpec(metric, "bytes", limit=limit, source="cuda", where=f"cuda:{device}")


class MpsProbe:
    """Bytes held by live MPS tensors (allocated) and by the Metal driver for this process, cache
    included (reserved)."""

    name = "mps"
    every = 1

    def __init__(self, mps: Any) -> None:
        self._mps = mps

    def read(self) -> Mapping[str, float]:
        return {"mps_allocated_bytes": float(self._mps.current_allocated_memory()),
                "mps_reserved_bytes": float(self._mps.driver_allocated_memory())}

    def spec(self, metric: str) -> MetricSpec:
        limit = getattr(self._mps, "recommended_max_memory", None)
        return MetricSpec(metric, "bytes", limit=float(limit()) if limit else None, source="mps", where="mps")


def device_probes(torch: Any) -> list[Any]:
    probes: list[Any] = []
    if torch.cuda.is_available():
        probes.append(CudaProbe(torch.cuda))
    if torch.backends.mps.is_available():
        probes.append(MpsProbe(torch.mps))
    return probes


def empty_caches(torch: Any) -> Callable[[], None]:
    """torch.cuda/mps.empty_cache for the devices in use: returns cached, unused blocks to the driver."""
    def clear() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        if torch.backends.mps.is_available():
            torch.mps.empty_cache()

    return clear


def device_rule(prefix: str) -> Rule:
    """Device memory: live tensors that keep growing (device_arrays), or only the caching allocator's
    reserve growing while allocated memory is flat (allocator_cache, benign; cleared periodically only
    when allocation retries show it gets in the way)."""
    allocated, reserved, retries = f"{prefix}_allocated_bytes", f"{prefix}_reserved_bytes", f"{prefix}_alloc_retries"

    def device_memory(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        unexplained = ev.unexplained(accepted)
        if allocated in unexplained and ev.survives(allocated):
            census = ev.reports.get("tensor_census")
            kept = census.kept_on(prefix) if census else ""
            return [ev.finding(
                "device_arrays", allocated, explains=(allocated, reserved),
                evidence=f"{ev.describe(allocated)} and survived gc and empty_cache()" + (f"; {kept}" if kept else ""),
                recommendation="tensors on the device are kept from step to step: look for results stored "
                               "across steps (lists, dicts, attributes) and store .item() or .cpu() copies",
            )]
        if reserved not in unexplained or ev.growing(allocated):
            return []
        retried = _count_during(ev, retries)
        rose = retried > 0
        took_back = ev.reclaimed_by(reserved) == "clear_cache"
        return [ev.finding(
            "allocator_cache", reserved, benign=True, reclaimed_by="clear_cache" if rose else None,
            evidence=f"{ev.describe(reserved)} while {allocated} stayed flat: PyTorch's caching allocator keeps "
                     f"freed blocks for reuse" + ("; empty_cache() took it back" if took_back else "")
                     + (f"; allocation retries rose by {retried:g} (fragmentation)" if rose else ""),
            recommendation="not a leak; if retries keep rising, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                           "or call torch.cuda.empty_cache() now and then (remedy clear_cache)" if rose else
                           "not a leak: the cache is reused; nothing to do",
        )]

    return Rule(45, device_memory)


def _count_during(ev: Evidence, metric: str) -> float:
    """How much a running count (never a suspect) rose over the investigation, by the ladders' readings."""
    before, after = ev.begin.before(metric), ev.end.after(metric)
    return after - before if before is not None and after is not None else 0.0


# --- hooks ----------------------------------------------------------------------------------------

class HookCount:
    """How many hooks the model's modules hold. The list of modules is refreshed every `refresh` reads,
    so a read costs about half a microsecond per module."""

    name = "hooks"
    every = 1
    refresh = 64

    def __init__(self, model: Any) -> None:
        self._model = weakref.ref(model)
        self._tables: list[dict[str, Any]] = []
        self._reads = 0
        self._spec = MetricSpec(HOOKS, "count", source="torch", where=f"hooks on {type(model).__qualname__}")

    def read(self) -> Mapping[str, float]:
        if self._reads % self.refresh == 0:
            model = self._model()
            self._tables = [vars(m) for m in model.modules()] if model is not None else []
        self._reads += 1
        return {HOOKS: float(sum(len(t.get(kind, ())) for t in self._tables for kind in HOOK_DICTS))}

    def spec(self, metric: str) -> MetricSpec:
        return self._spec


def hook_function(hook: Any) -> Any:
    """The function a hook runs: partials and bound methods unwrapped."""
    fn = getattr(hook, "func", hook)
    return getattr(fn, "__func__", fn)


def duplicate_handles(hooks: Mapping[int, Any]) -> list[int]:
    """Handle ids of hooks that run the same code as a hook registered before them on the same table.
    A lambda or closure made anew each step shares its code object, so it counts as the same hook."""
    seen: set[Any] = set()
    repeats = []
    for handle, hook in hooks.items():
        fn = hook_function(hook)
        key = getattr(fn, "__code__", None) or type(fn)
        if key in seen:
            repeats.append(handle)
        seen.add(key)
    return repeats


@dataclass(frozen=True)
class RepeatedHook:
    module: str
    kind: str
    function: str
    location: str | None
    repeats: int
    module_ref: Any  # a weakref to the module that holds the hook table


def repeated_hooks(model: Any) -> list[RepeatedHook]:
    """Hook tables of the model's modules that hold the same hook more than once, most repeats first."""
    found = []
    for path, module in model.named_modules():
        for kind in HOOK_DICTS:
            hooks = vars(module).get(kind) or {}
            repeats = duplicate_handles(hooks)
            if repeats:
                fn = hook_function(hooks[repeats[-1]])
                label = f"module {path!r} ({type(module).__qualname__})" if path else type(module).__qualname__
                found.append(RepeatedHook(label, kind, getattr(fn, "__qualname__", repr(fn)),
                                          code_location(fn), len(repeats), weakref.ref(module)))
    return sorted(found, key=lambda r: r.repeats, reverse=True)


def hooks_rule(model_ref: Callable[[], Any]) -> Rule:
    def hook_accumulation(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        unexplained = ev.unexplained(accepted)
        if HOOKS not in unexplained:
            return []
        model = model_ref()
        repeats = repeated_hooks(model) if model is not None else []
        explains = (HOOKS, "rss_bytes") if "rss_bytes" in unexplained else (HOOKS,)
        if not repeats:
            return [ev.finding(
                "hook_accumulation", HOOKS, location=ev.specs[HOOKS].where, explains=explains,
                evidence=f"{ev.describe(HOOKS)}, each a different function" + _step_time(ev),
                recommendation="register hooks once, outside the training loop, or keep each handle and call "
                               "handle.remove() when it is done")]
        top = repeats[0]
        return [ev.finding(
            "hook_accumulation", HOOKS, location=top.location, explains=explains,
            subject=[(r.module_ref, r.kind) for r in repeats],
            evidence=f"{ev.describe(HOOKS)}; {top.module} holds {top.repeats + 1} {HOOK_DICTS[top.kind]}s running "
                     f"{top.function}" + (f" ({len(repeats) - 1} more hook tables hold repeats)" if repeats[1:] else "")
                     + _step_time(ev),
            recommendation=f"register {top.function} once, outside the training loop, or keep the handle that "
                           f"register_*_hook returns and call handle.remove() after the step")]

    return Rule(20, hook_accumulation)


# --- retained autograd graphs ---------------------------------------------------------------------

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
    for path, scope, value, origin, get, rebind in _places(roots, frame):
        count = _holds(value, ids, depth=2)
        if count and id(value) not in holders:
            region, line = _region(origin)
            holders[id(value)] = Holder(path, scope, count, region, line, get, rebind)
    return sorted(holders.values(), key=lambda h: h.count, reverse=True)


#: (path, scope, value, origin: the owner's class or the frame, get, rebind) of a place that may hold tensors.
Place = tuple[str, str, Any, Any, Callable[[], Any], "Callable[[Any], None] | None"]


def _places(roots: Sequence[Any], frame: Any) -> Iterator[Place]:
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
    for name, value in list(frame.f_locals.items()):
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
    them. When the holder is a watched container that itself keeps growing, the finding is on its length:
    a list that grows keeps growing memory even with detached items, so the fix is the user's (store
    .item(), clear it). Otherwise it is on memory, where detach_retained frees the graphs and is judged."""

    def retained_graph(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        census = ev.reports.get("tensor_census")
        if census is None or not census.retained:
            return []
        unexplained = ev.unexplained(accepted)
        holder = census.holders[0] if census.holders else None
        containers = [m for m, spec in ev.specs.items() if holder and spec.source == "container"
                      and (spec.where or "").split(" (")[0] == holder.name and _grows(ev, m)]
        candidates = [f"{d}_allocated_bytes" for d in ("cuda", "mps") if d in census.devices] + ["rss_bytes"]
        memory = next((m for m in candidates if m in unexplained and ev.survives(m)), None)
        metric = next(iter(containers), memory)
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
        also = f"; {ev.describe(memory)}" if memory and memory != metric else ""
        return [ev.finding(
            "retained_graph", metric, location=location,
            explains=tuple(dict.fromkeys([metric, *containers, *([memory] if memory else []), *twin])),
            subject=census.holders, evidence=f"{ev.describe(metric)}{also}; {census.describe()}",
            recommendation=advice)]

    return Rule(30, retained_graph)


def _grows(ev: Evidence, metric: str) -> bool:
    """Growing now, or known to grow (a metric an earlier finding explains is no longer investigated)."""
    trend = ev.trends.get(metric)
    return metric in ev.confirmed or bool(trend and trend.growing)


# --- DataLoader workers -----------------------------------------------------------------------------

def worker_datasets(loader_type: type) -> list[Any]:
    """Datasets of the live DataLoaders that use worker processes."""
    return [loader.dataset for loader in live_instances(loader_type) if loader.num_workers > 0]


def python_container(dataset: Any, depth: int = 2) -> tuple[str, Any] | None:
    """The largest Python container of at least MANY_ITEMS items among the dataset's attributes (looking
    into wrapped datasets): copying pages on reference-count writes matters for many small objects, not
    for a tuple of a few tensors."""
    best: tuple[str, Any] | None = None
    for attr, value in vars(dataset).items() if hasattr(dataset, "__dict__") else ():
        found = (attr, value) if isinstance(value, CONTAINERS) and len(value) >= MANY_ITEMS else None
        if found is None and depth > 1 and hasattr(value, "__getitem__") and hasattr(value, "__dict__"):
            inner = python_container(value, depth - 1)
            found = (f"{attr}.{inner[0]}", inner[1]) if inner else None
        if found and (best is None or len(found[1]) > len(best[1])):
            best = found
    return best


def loader_rule(loader_type: type) -> Rule:
    """Worker memory growth with a DataLoader whose dataset keeps its samples in a Python container:
    name the container. Without one, the process integration's rule reports the workers."""

    def dataloader_workers(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        metric = "workers_uss_bytes"
        if metric not in ev.unexplained(accepted) or not ev.survives(metric):
            return []
        found = [(ds, c) for ds in worker_datasets(loader_type) if (c := python_container(ds))]
        if not found:
            return []
        dataset, (attr, container) = max(found, key=lambda f: len(f[1][1]))
        owner = type(dataset)
        name = f"{owner.__qualname__}.{attr}"
        return [ev.finding(
            "dataloader_workers", metric, location=f"{name} ({code_location(owner)})",
            explains=(metric, "workers_pss_bytes"),
            evidence=f"{ev.describe(metric)}; the DataLoader workers read {name}, a Python "
                     f"{type(container).__name__} of {len(container)} objects: each read writes the object's "
                     f"reference count, so the page holding it is copied into the worker "
                     f"(copy-on-write, pytorch#13246)",
            recommendation=f"store {name} as a numpy array (numbers, or fixed-width strings), an Arrow table or a "
                           f"memory-mapped file instead of a Python {type(container).__name__}, so the workers "
                           f"read buffers and write no reference counts")]

    return Rule(35, dataloader_workers)


# --- the integration ----------------------------------------------------------------------------------

def integration(model: Any = None, optimizer: Any = None) -> Integration:
    """PyTorch probes, forensics, cleanups and rules for a run of `model` (hooks, attributes) trained by
    `optimizer`; both optional. Raises ValueError for objects of the wrong type."""
    torch = require_torch()
    if model is not None and not isinstance(model, torch.nn.Module):
        raise ValueError(f"model={model!r}: expected a torch.nn.Module (or None)")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer={optimizer!r}: expected a torch.optim.Optimizer (or None)")
    model = unwrap(model) if model is not None else None
    model_ref = weakref.ref(model) if model is not None else (lambda: None)
    devices = device_probes(torch)
    rules = [retained_rule(), loader_rule(torch.utils.data.DataLoader)] + [device_rule(p.name) for p in devices]
    if model is not None:
        rules.append(hooks_rule(model_ref))
    return Integration(
        name="torch",
        probes=devices + ([HookCount(model)] if model is not None else []),
        forensics=[TensorCensus(torch.Tensor, lambda: [m for m in (model_ref(),) if m is not None])],
        cleanups=[Cleanup("clear_cache", empty_caches(torch))] if devices else [],
        rules=rules,
        targets={k: v for k, v in (("model", model), ("optimizer", optimizer)) if v is not None},
    )
