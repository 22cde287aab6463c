"""PyTorch knowledge: what to read every sample, what to look at when memory grows, how to name the cause.

Probes (cheap): CUDA/MPS allocated and reserved bytes and CUDA's allocation retries (only where the device
exists and the program uses it), the number of hooks on the model's modules, and the bytes of a dataset's
Python container that forked DataLoader workers copied (their pagemaps, integrations/_pages.py).
Forensic (escalation only): the tensor census of integrations/_torch_graphs.py, which names who keeps
tensors across steps (a model attribute, a local list, a global) and the line that stores them.
Rules: hook_accumulation, retained_graph, kept CPU tensors without a graph (container_growth or
device_arrays at their holder), the device allocator (allocator_cache or device_arrays) and
dataloader_workers naming the dataset's Python container. Cleanup: the device cache clear, "clear_cache".
"""

from __future__ import annotations

import multiprocessing
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from leakdoctor._base.evidence import Evidence, Rule
from leakdoctor._base.findings import Finding
from leakdoctor._base.integration import Cleanup, Integration
from leakdoctor._base.messages import Record, msg
from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.source import caller_frame, code_location, is_user_file, short_path, stored_attributes
from leakdoctor.integrations._holders import CONTAINERS, live_instances, places
from leakdoctor.integrations._pages import ItemPages
from leakdoctor.integrations._process import GROWN, NEW, Throttled
from leakdoctor.integrations._python import step_time_note
from leakdoctor.integrations._torch_graphs import TensorCensus, kept_tensors_rule, last_look, retained_rule

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


def rank_maximum(values: list[int]) -> list[int]:
    """The element-wise maximum over the ranks of each rank's few integers (stopping.Agree): one all_reduce
    (MAX). Every rank must call it at the same step. On the current CUDA device under NCCL (which reduces
    no CPU tensor), else on the CPU (gloo)."""
    torch = require_torch()
    dist = torch.distributed
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flags = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [int(v) for v in flags.tolist()]


def world_size() -> int:
    """How many ranks torch.distributed runs (1 when it is not initialized)."""
    dist = require_torch().distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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
    metrics = ("cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_alloc_retries")

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
    metrics = ("mps_allocated_bytes", "mps_reserved_bytes")

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
            kept = census.kept_on(prefix) if census else None
            return [ev.finding(
                "device_arrays", allocated, explains=(allocated, reserved),
                evidence=msg("survived_empty_cache", growth=ev.describe(allocated), kept=kept or None),
                recommendation=msg("store_item_or_cpu"),
            )]
        if reserved not in unexplained or ev.growing(allocated):
            return []
        retried = _count_during(ev, retries)
        rose = retried > 0
        took_back = ev.reclaimed_by(reserved) == "clear_cache"
        return [ev.finding(
            "allocator_cache", reserved, benign=True, reclaimed_by="clear_cache" if rose else None,
            evidence=msg("torch_cache", growth=ev.describe(reserved), allocated=allocated,
                         took_back=msg("empty_cache_took_back") if took_back else None,
                         retries=msg("retries_rose", count=retried) if rose else None),
            recommendation=msg("expandable_segments") if rose else msg("cache_reused"),
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
    metrics = (HOOKS,)
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
                evidence=msg("hooks_differ", growth=ev.describe(HOOKS), step_time=step_time_note(ev)),
                recommendation=msg("register_hooks_once"))]
        top = repeats[0]
        return [ev.finding(
            "hook_accumulation", HOOKS, location=top.location, explains=explains,
            subject=[(r.module_ref, r.kind) for r in repeats],
            evidence=msg("hooks_held", growth=ev.describe(HOOKS), module=top.module, count=top.repeats + 1,
                         kind=HOOK_DICTS[top.kind], function=top.function,
                         more=msg("more_hook_tables", count=len(repeats) - 1) if repeats[1:] else None,
                         step_time=step_time_note(ev)),
            recommendation=msg("register_hook_once", function=top.function))]

    return Rule(20, hook_accumulation)


# --- DataLoader workers -----------------------------------------------------------------------------

COPIED = "workers_copied_bytes"
#: Fraction of time the copied-pages probe may take (the doctor's default overhead budget).
BUDGET = 0.005


def worker_datasets(loader_type: type) -> list[Any]:
    """Datasets of the live DataLoaders that use worker processes."""
    return [loader.dataset for loader in live_instances(loader_type) if loader.num_workers > 0]


def forked_datasets(loader_type: type) -> list[Any]:
    """Datasets of the DataLoaders whose workers are forked (they share this process's pages): those the
    user's frames hold (their variables, and attributes of the user's objects there), else every live one
    (a walk of the heap: tens of milliseconds)."""
    held = [v for _, _, v, *_ in places([], caller_frame()) if isinstance(v, loader_type)]
    found = []
    for loader in held or live_instances(loader_type):
        context = loader.multiprocessing_context  # None: the default, which this must not fix
        method = context.get_start_method() if context is not None else (
            multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0])
        if loader.num_workers > 0 and method == "fork":
            found.append(loader.dataset)
    return found


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


def largest_container(datasets: list[Any]) -> tuple[Any, str, Any] | None:
    """(dataset, attribute path, container) of the largest Python container among the datasets."""
    found = [(ds, *c) for ds in datasets if (c := python_container(ds))]
    return max(found, key=lambda f: len(f[2])) if found else None


@dataclass
class Copied:
    """The Python container whose pages the workers copy: `name` ("RecordsDataset.records"), the dataset's
    class, what it holds, its type and identity (no reference: a dataset must not outlive its loader
    because leakdoctor looked at it) and its item pages (integrations/_pages.py)."""

    name: str
    owner: type
    description: Record
    kind: str
    ident: tuple[int, int]  # id and length
    pages: ItemPages

    def location(self) -> str:
        """'RecordsDataset.records (data.py:12)': where the class is defined (read from its source: kept
        for the finding, out of the probe's reads)."""
        defined = code_location(self.owner)
        return f"{self.name} ({defined})" if defined else self.name


class CopiedPages(Throttled):
    """Bytes of the dataset's Python container that forked DataLoader workers have copied: the pytorch#13246
    growth, read from the workers' pagemaps in a fraction of a millisecond (integrations/_pages.py) where
    their USS takes tens, so within the budget it reads about once a detection window even at steps of a
    few milliseconds (it paces itself: the doctor does not thin its reads again by their cost). The
    container is looked for each time new workers appear (the user's frames, else a walk of the heap for
    live DataLoaders), outside the measured cost."""

    name = "copied_pages"

    def __init__(self, loader_type: type, budget: float = BUDGET) -> None:
        super().__init__(budget)
        self._loader_type = loader_type
        self.copied: Copied | None = None
        self._pids: frozenset[int] = frozenset()

    def ready(self) -> bool:
        """Workers to read, looked for only when a read is due (a sample on which none is costs a clock
        read, not a listing of this process's children)."""
        return self._workers()

    def read_now(self) -> Mapping[str, float]:
        return super().read_now() if self._workers() else {}

    def measure(self, exact: bool = False) -> Mapping[str, float]:
        assert self.copied is not None
        sizes = [b for pid in self._pids if (b := self.copied.pages.copied_bytes(pid, exact)) is not None]
        return {COPIED: float(sum(sizes))} if sizes else {}

    def measure_now(self) -> Mapping[str, float]:
        """Every item page, for the investigation's ladder (a few ms), where the samples read a few hundred."""
        return self.measure(exact=True)

    def _workers(self) -> bool:
        """Are there workers whose copies can be read? Looks for the dataset again when new ones appear."""
        pids = frozenset(child.pid for child in multiprocessing.active_children())
        new, self._pids = pids - self._pids, pids
        if new:
            self.copied = self._find()
            if self.copied is not None:
                self.measure()  # a first, cold read (files opened, code paths warmed) the throttle leaves out
        return bool(pids) and self.copied is not None

    def _find(self) -> Copied | None:
        """The largest Python container of the forked workers' datasets, with its item pages."""
        found = largest_container(forked_datasets(self._loader_type))
        if found is None:
            return None
        dataset, attr, container = found
        ident = (id(container), len(container))
        if self.copied is not None and self.copied.ident == ident:
            return self.copied
        pages = ItemPages.of(container)
        if pages is None:
            return None
        owner, kind = type(dataset), type(container).__name__
        # the last item only: reading an item writes its page here (ItemPages.of read that one already)
        held = msg("python_container", kind=kind, count=len(container), item=type(container[-1]).__name__)
        return Copied(f"{owner.__qualname__}.{attr}", owner, held, kind, ident, pages)

    def spec(self, metric: str) -> MetricSpec:
        return MetricSpec(metric, "bytes", source="torch", where=self.copied.name if self.copied else None)


def loader_advice(name: str, container: str) -> Record:
    return msg("loader_advice", holder=name, kind=container)


def datasets_within(dataset: Any, depth: int = 2) -> list[Any]:
    """The dataset and those it wraps (a Subset's, a ConcatDataset's), `depth` deep: the objects whose
    __getitem__ the workers run."""
    found = [dataset]
    if depth > 1 and hasattr(dataset, "__dict__"):
        for value in vars(dataset).values():
            inner = value if isinstance(value, (list, tuple)) else [value]
            for item in inner[:8]:
                if hasattr(item, "__getitem__") and hasattr(item, "__dict__") and not isinstance(item, type):
                    found += datasets_within(item, depth - 1)
    return found


def getitem_store(datasets: list[Any]) -> tuple[type, str, Any, str] | None:
    """(dataset class, attribute, its container here, 'file:line') of the first line of a dataset's
    __getitem__ (or __getitems__), in the user's code, that stores into a container attribute of the
    dataset (`self.samples.append(img)`): the workers run it, each on its own copy of the dataset, so the
    container grows in every worker while this process's stays as it was. Read from the source: the
    workers' objects cannot be seen from here."""
    for dataset in datasets:
        for held in datasets_within(dataset):
            for method in ("__getitem__", "__getitems__"):
                code = getattr(getattr(type(held), method, None), "__code__", None)
                if code is None or not is_user_file(code.co_filename):
                    continue
                for attr, line in stored_attributes(code):
                    value = vars(held).get(attr) if hasattr(held, "__dict__") else None
                    if isinstance(value, CONTAINERS):
                        return type(held), attr, value, f"{short_path(code.co_filename)}:{line}"
    return None


def loader_rule(loader_type: type, probe: CopiedPages) -> Rule:
    """Workers that copy the pages of their dataset's Python container: on the copied bytes where the pagemap
    probe reads them, else on the workers' growth when a dataset keeps its samples in a Python container,
    or when its __getitem__ stores into one (each worker's copy grows). Without either, the process
    integration's rule reports the workers."""

    def dataloader_workers(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        unexplained = ev.unexplained(accepted)
        explains = (COPIED, GROWN, NEW)
        copied = probe.copied
        if COPIED in unexplained and ev.survives(COPIED) and copied is not None:
            grown, now = ev.end.after(GROWN), ev.end.after(COPIED) or 0.0
            return [ev.finding(
                "dataloader_workers", COPIED, location=copied.location(), explains=explains,
                evidence=msg("workers_copied", growth=ev.describe(COPIED), copied=now,
                             pages=copied.pages.nbytes, holder=copied.name, description=copied.description,
                             alone=msg("workers_alone_grew", size=grown) if grown else None),
                recommendation=loader_advice(copied.name, copied.kind))]
        if GROWN not in unexplained or not ev.survives(GROWN):
            return []
        datasets = worker_datasets(loader_type)
        found = largest_container(datasets)
        if found is None:
            return stored_in_workers(ev, datasets, explains)
        dataset, attr, container = found
        owner = type(dataset)
        name = f"{owner.__qualname__}.{attr}"
        return [ev.finding(
            "dataloader_workers", GROWN, location=f"{name} ({code_location(owner)})", explains=explains,
            evidence=msg("workers_read_container", growth=ev.describe(GROWN), holder=name,
                         kind=type(container).__name__, count=len(container)),
            recommendation=loader_advice(name, type(container).__name__))]

    return Rule(35, dataloader_workers)


def stored_in_workers(ev: Evidence, datasets: list[Any], explains: tuple[str, ...]) -> list[Finding]:
    """The workers' growth named by the line of a dataset's __getitem__ that stores into its container."""
    found = getitem_store(datasets)
    if found is None:
        return []
    owner, attr, container, line = found
    name, kind = f"{owner.__qualname__}.{attr}", type(container).__name__
    return [ev.finding(
        "dataloader_workers", GROWN, location=f"{name} ({line})", explains=explains,
        evidence=msg("getitem_stores", growth=ev.describe(GROWN), dataset=owner.__qualname__, holder=name,
                     line=line, kind=kind, count=len(container)),
        recommendation=msg("no_samples_on_dataset", holder=name))]


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
    copied = CopiedPages(torch.utils.data.DataLoader)
    rules = [retained_rule(), kept_tensors_rule(), loader_rule(torch.utils.data.DataLoader, copied)]
    rules += [device_rule(p.name) for p in devices]
    if model is not None:
        rules.append(hooks_rule(model_ref))
    roots = lambda: [m for m in (model_ref(),) if m is not None]  # noqa: E731
    return Integration(
        name="torch",
        probes=devices + [copied] + ([HookCount(model)] if model is not None else []),
        forensics=[TensorCensus(torch.Tensor, roots)],
        last_looks=[last_look(torch.Tensor, roots)],
        cleanups=[Cleanup("clear_cache", empty_caches(torch))] if devices else [],
        rules=rules,
        targets={k: v for k, v in (("model", model), ("optimizer", optimizer)) if v is not None},
    )
