"""JAX knowledge: live arrays per platform, backend compiles, the forensics that name what keeps
compiling and why, and the rules for compile_cache and device_arrays.

A healthy JAX loop compiles during its first steps and then never again: every later call hits a cache.
A loop that compiles on every step is leaking its compile caches (each compiled executable is kept):
  * a jitted step re-traced because a Python value it depends on changes every step (a static
    argument, a closure over a Python scalar): the tracing-cache misses say which function and why;
  * an un-jitted `lax.cond` whose branches are closures made anew on every call (the old optax RAdam,
    optax#969, jax#12719): each call traces the branches again and compiles a new `cond`. A jaxpr scan
    of the optimizer's update finds those conds: traced twice, their branch jaxprs differ.
Compiles are counted with a `jax.monitoring` listener on the backend-compile event (one process-wide
listener, installed once); live arrays with `jax.live_arrays()`. `jax.clear_caches()` frees compiled
executables, but it also throws away every healthy compilation, so it serves the clear_cache remedy
only and never runs in the investigation's cleanup ladder.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from leakdoctor._base.evidence import Evidence, Rule
from leakdoctor._base.findings import Finding
from leakdoctor._base.messages import Record, msg, render
from leakdoctor._base.integration import Cleanup, Integration
from leakdoctor._base.metric import FunctionProbe, MetricSpec
from leakdoctor._base.source import caller_frame, is_user_file, short_path, user_site
from leakdoctor._base.trend import is_material
from leakdoctor._base.units import format_value
from leakdoctor.integrations._holders import Holder, find_holders

#: The event jax (0.4.30 and later, 0.10 included) records around every XLA backend compile.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILES = "jax_compiles"
RSS = "rss_bytes"
_MISS_LOGGER = "jax._src.interpreters.partial_eval"


def require() -> Any:
    """The jax module, or an ImportError that says how to install it."""
    try:
        import jax
    except ImportError as err:
        raise ImportError("leakdoctor's JAX support needs jax: pip install leakdoctor[jax]") from err
    return jax


# --- multi-process runs (jax.distributed) --------------------------------------------------------------

def process_count() -> int:
    """How many processes the JAX run has (1 without jax.distributed.initialize)."""
    return int(require().process_count())


def process_rank() -> int | None:
    """This process's index in a multi-process JAX run (jax.distributed.initialize, more than one
    process), else None."""
    jax = require()
    return int(jax.process_index()) if jax.process_count() > 1 else None


def process_maximum(values: list[int]) -> list[int]:
    """The element-wise maximum over the processes of each process's few integers (stopping.Agree): one
    process_allgather. Every process must call it at the same step."""
    import numpy as np
    from jax.experimental import multihost_utils

    rows = np.asarray(multihost_utils.process_allgather(np.array(values, dtype=np.int32)))
    return [int(v) for v in rows.reshape(-1, len(values)).max(axis=0)]


def live_bytes(platform: str) -> str:
    return f"jax_live_bytes_{platform}"


def live_count(platform: str) -> str:
    return f"jax_live_arrays_{platform}"


# --- backend compiles: one process-wide listener ------------------------------------------------------

class _CompileListener:
    """Counts backend compiles; while an investigation records, also by function name, time and the line
    of the user's code that made it compile (the call of the jitted function: a compile runs inside it)."""

    def __init__(self) -> None:
        self.count = 0
        self.recorders: list["CompileLog"] = []

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if event != COMPILE_EVENT:
            return
        self.count += 1
        if self.recorders:
            site = user_site()
            for recorder in self.recorders:
                recorder.record(str(kwargs.get("fun_name", "?")), duration, site)


_listener: _CompileListener | None = None


def compile_listener() -> _CompileListener:
    """The process-wide compile counter, registered with jax.monitoring on first use."""
    global _listener
    if _listener is None:
        require().monitoring.register_event_duration_secs_listener(listener := _CompileListener())
        _listener = listener
    return _listener


def compile_probe() -> FunctionProbe:
    """Backend compiles since the listener was installed: flat in a healthy loop after warm-up."""
    listener = compile_listener()
    spec = MetricSpec(COMPILES, "count", source="jax", where="jax backend compiles")
    return FunctionProbe("jax_compiles", lambda: {COMPILES: float(listener.count)}, {COMPILES: spec})


# --- live arrays ------------------------------------------------------------------------------------

def _platforms() -> list[str]:
    return sorted({d.platform for d in require().local_devices()})


def _device_limit(platform: str) -> float | None:
    """The allocator's limit on this process's first device of `platform` (GPU/TPU); None on CPU. (In a
    multi-process run jax.devices() lists every process's devices, and only this process's have stats.)"""
    stats = getattr(require().local_devices(backend=platform)[0], "memory_stats", lambda: None)()
    return float(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def live_array_probe() -> FunctionProbe:
    """Count and bytes of the arrays alive on each platform (the backends' live_arrays). Sizes are
    looked up by abstract value (`a.aval`, a cached attribute): ten times cheaper than `a.nbytes`."""
    from jax.extend.backend import get_backend

    backends = {p: get_backend(p) for p in _platforms()}
    specs = {}
    for p in backends:
        where = f"jax.live_arrays({p!r})"
        # the bytes confirm themselves: an exact count that a one-time jump (an evaluation's arrays) lifts
        # once, where a leak goes on rising through the triage's windows
        specs[live_bytes(p)] = MetricSpec(live_bytes(p), "bytes", limit=_device_limit(p), source="jax", where=where,
                                          confirmed_by=(live_bytes(p),))
        specs[live_count(p)] = MetricSpec(live_count(p), "count", source="jax", where=where,
                                          confirmed_by=(live_bytes(p),))
    sizes: dict[Any, int] = {}

    def read() -> Mapping[str, float]:
        values = {}
        for p, backend in backends.items():
            arrays = backend.live_arrays()
            total = 0
            for a in arrays:
                size = sizes.get(a.aval)
                if size is None:
                    if len(sizes) > 4096:  # a program of ever-new shapes must not grow this cache
                        sizes.clear()
                    size = sizes[a.aval] = a.nbytes
                total += size
            values[live_count(p)] = float(len(arrays))
            values[live_bytes(p)] = float(total)
        return values

    return FunctionProbe("jax_live_arrays", read, specs)


# --- forensics --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheMiss:
    """One tracing-cache miss as jax explains it (jax_explain_cache_misses)."""

    function: str
    defined_at: str | None
    reason: str
    called_at: str | None = None  # the user's line that called the function (jax explains inside the call)


@dataclass
class CompileActivity:
    """What compiled during the window: {function: (count, seconds)}, the tracing-cache misses, and where
    the user's code made each function compile ({function: {file:line: count}})."""

    functions: dict[str, tuple[int, float]]
    misses: list[CacheMiss]
    sites: dict[str, dict[str, int]] = field(default_factory=dict)

    def top(self, n: int = 3) -> str:
        ranked = sorted(self.functions.items(), key=lambda kv: -kv[1][0])[:n]
        return ", ".join(f"{name} {count}x ({format_value(sec, 'seconds')})" for name, (count, sec) in ranked)

    def rows(self, n: int = 3) -> list[dict[str, Any]]:
        """The functions compiled most often: each one's name, compiles and seconds spent compiling."""
        ranked = sorted(self.functions.items(), key=lambda kv: -kv[1][0])[:n]
        return [{"function": name, "count": count, "seconds": sec} for name, (count, sec) in ranked]

    def most_compiled(self) -> str | None:
        """The function compiled most often in the window ('jit(train_step)')."""
        return max(self.functions, key=lambda f: self.functions[f][0]) if self.functions else None

    def compiled(self, name: str) -> bool:
        """Did a function called `name` (e.g. 'cond' for 'jit(cond)') compile?"""
        return any(re.search(rf"\b{re.escape(name)}\b", f) for f in self.functions)

    def called_at(self, function: str | None) -> str | None:
        """The user's line that made `function` ('jit(train_step)', or 'train_step' as a miss names it)
        compile most often in the window."""
        names = [f for f in self.sites if f == function or _unjitted(f) == function]
        counts = Counter({site: n for name in names for site, n in self.sites[name].items()})
        return counts.most_common(1)[0][0] if counts else None

    def repeated_miss(self) -> tuple[CacheMiss, int] | None:
        """The user function that missed the tracing cache most often, with how often."""
        counts = Counter((m.function, m.defined_at) for m in self.misses)
        if not counts:
            return None
        (function, where), count = counts.most_common(1)[0]
        last = next(m for m in reversed(self.misses) if (m.function, m.defined_at) == (function, where))
        return last, count


def _unjitted(name: str) -> str:
    """'train_step' for 'jit(train_step)'."""
    found = re.fullmatch(r"\w+\((.*)\)", name)
    return found.group(1) if found else name


class _MissHandler(logging.Handler):
    """Collects jax's explanations of tracing-cache misses. jax logs them inside the call that misses, so
    the user's frame on the stack is the line that called the function."""

    def __init__(self, misses: list[CacheMiss]) -> None:
        super().__init__(logging.DEBUG)
        self.misses = misses

    def emit(self, record: logging.LogRecord) -> None:
        miss = parse_cache_miss(record.getMessage())
        if miss is not None:
            self.misses.append(dataclasses.replace(miss, called_at=user_site()))


def parse_cache_miss(message: str) -> CacheMiss | None:
    """A CacheMiss from jax's 'TRACING CACHE MISS' explanation, else None."""
    if "TRACING CACHE MISS" not in message:
        return None
    found = (re.search(r"never seen function:\s*(\S+) id=\d+(?: defined at (\S+))?", message)
             or re.search(r"\bfor (\S+)(?: defined at (\S+))?\n", message))
    if not found:
        return None
    function, where = found.group(1), found.group(2)
    if "never seen function" in message:
        reason = "a new function object on every call" + (
            " (the same code is re-defined repeatedly)" if "re-defined repeatedly" in message else "")
    else:
        reason = message.split("closest previous key:", 1)[-1].strip()
        # the metadata jax prints after the changed argument is the whole static pytree (reprs of functions)
        reason = " ".join(reason.split(" with pytree metadata", 1)[0].split())[:400]
    return CacheMiss(function, _short_location(where) if where else None, reason)


def _short_location(where: str) -> str:
    """'/abs/path/train.py:16' as 'train.py:16' when the file lies under the working directory."""
    path, _, line = where.rpartition(":")
    return f"{short_path(path)}:{line}" if path and line.isdigit() else where


class CompileLog:
    """During the window: which functions compile (the listener, by name) and why jax traced them
    again (jax_explain_cache_misses, captured from jax's logger instead of printed)."""

    name = "jax_compiles"

    def __init__(self) -> None:
        self._functions: dict[str, list[float]] = {}
        self._sites: dict[str, Counter[str]] = {}
        self._misses: list[CacheMiss] = []
        self._handler: _MissHandler | None = None
        self._restore: tuple[bool, bool] | None = None

    def record(self, function: str, seconds: float, site: str | None = None) -> None:
        entry = self._functions.setdefault(function, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        if site is not None:
            self._sites.setdefault(function, Counter())[site] += 1

    def begin(self) -> None:
        jax = require()
        self._functions, self._sites, self._misses = {}, {}, []
        compile_listener().recorders.append(self)
        logger = logging.getLogger(_MISS_LOGGER)
        self._handler = _MissHandler(self._misses)
        logger.addHandler(self._handler)
        explaining = bool(jax.config.jax_explain_cache_misses)
        self._restore = (explaining, logger.propagate)
        if not explaining:  # switched on by us: capture quietly, print nothing
            logger.propagate = False
            jax.config.update("jax_explain_cache_misses", True)

    def end(self, steps: int) -> CompileActivity:
        listener = compile_listener()
        if self in listener.recorders:
            listener.recorders.remove(self)
        logger = logging.getLogger(_MISS_LOGGER)
        if self._handler is not None:
            logger.removeHandler(self._handler)
        if self._restore is not None:
            explaining, propagate = self._restore
            if not explaining:
                require().config.update("jax_explain_cache_misses", False)
                logger.propagate = propagate
        self._handler, self._restore = None, None
        return CompileActivity({k: (int(n), s) for k, (n, s) in self._functions.items()}, list(self._misses),
                               {k: dict(v) for k, v in self._sites.items()})


@dataclass
class ArrayGrowth:
    """Live arrays gained during the window, by (platform, dtype[shape]): (count, bytes), most bytes first;
    and who holds a sample of the new ones (integrations/_holders.py), those holding most first."""

    rows: list[tuple[str, int, float]]
    holders: list[Holder] = field(default_factory=list)

    def top(self, n: int = 3) -> str:
        return ", ".join(f"+{count} {kind} ({format_value(size, 'bytes')})" for kind, count, size in self.rows[:n])

    def records(self, n: int = 3) -> list[dict[str, Any]]:
        """The kinds of arrays gained most: each one's kind ('float32[4] on cpu'), count and bytes."""
        return [{"arrays": kind, "count": count, "size": size} for kind, count, size in self.rows[:n]]


def _kind(array: Any, platform: str) -> str:
    return f"{array.dtype}[{','.join(map(str, array.shape))}] on {platform}"


def _live() -> list[tuple[str, Any]]:
    """(kind, array) of every live array on every platform."""
    jax = require()
    return [(_kind(a, p), a) for p in _platforms() for a in jax.live_arrays(p)]


class LiveArrayDiff:
    """Live arrays by platform, dtype and shape at the start and end of the window: what accumulates, and
    who holds it: the places of the user's program (its loop's variables, globals, attributes of its
    objects) holding a sample of the arrays of the kinds that gained, created during the window."""

    name = "jax_live_arrays"
    #: New arrays whose holders are looked for.
    sample = 64

    def __init__(self) -> None:
        self._before: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        self._old: dict[int, weakref.ref] = {}

    def begin(self) -> None:
        live = _live()
        self._before = _census(live)
        self._old = {id(a): weakref.ref(a) for _, a in live}

    def end(self, steps: int) -> ArrayGrowth:
        live = _live()
        counts, sizes = _census(live)
        counts.subtract(self._before[0])
        sizes.subtract(self._before[1])
        rows = sorted(((kind, n, float(sizes[kind])) for kind, n in counts.items() if n > 0), key=lambda r: -r[2])
        kept = {kind for kind, n, _ in rows if n >= max(2, steps // 2)}  # half an array a step, or more
        new = [a for kind, a in live if kind in kept and not self._is_old(a)][-self.sample:]
        self._before, self._old = (Counter(), Counter()), {}
        return ArrayGrowth(rows, find_holders(new, [], caller_frame()) if new else [])

    def _is_old(self, array: Any) -> bool:
        ref = self._old.get(id(array))
        return ref is not None and ref() is array


def _census(live: list[tuple[str, Any]]) -> tuple[Counter[str], Counter[str]]:
    """Live arrays by 'dtype[shape] on platform': how many, and how many bytes."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for kind, a in live:
        counts[kind] += 1
        sizes[kind] += a.nbytes
    return counts, sizes


@dataclass(frozen=True)
class CondSite:
    """A `lax.cond` in a traced function: where it is called, its branches, and whether its branches are
    traced anew on every call (closures made per call: an un-jitted call compiles the cond again)."""

    location: str
    function: str
    branches: tuple[str, ...]
    retraced: bool

    def describe(self) -> str:
        return render(self.record())

    def record(self) -> Record:
        return msg("lax_cond", site=self.location, function=self.function, branches=list(self.branches))


@dataclass
class OptimizerCall:
    """An optimizer update to scan: the optax transformation and the arguments of one `update` call."""

    transformation: Any
    updates: Any
    opt_state: Any
    params: Any


@dataclass
class CondReport:
    """The conds found in an optimizer's update; `transformation` is the scanned optax transformation."""

    transformation: Any
    sites: list[CondSite] = field(default_factory=list)

    @property
    def retraced(self) -> list[CondSite]:
        return [s for s in self.sites if s.retraced]


def _cond_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every cond equation in a jaxpr and its sub-jaxprs, in a fixed order."""
    from jax.extend.core import jaxprs_in_params

    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cond":
            yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from _cond_eqns(sub)


def _site_of(eqn: Any, other: Any | None) -> CondSite:
    from jax.extend.source_info_util import summarize

    text = summarize(eqn.source_info)  # 'path/file.py:35:18 (update_fn)'
    found = re.match(r"(.*?):(\d+)(?::\d+)? \((.*)\)$", text)
    location, function = (f"{short_path(found.group(1))}:{found.group(2)}", found.group(3)) if found else (text, "?")
    branches = eqn.params["branches"]
    names = tuple(_branch_name(b) for b in reversed(branches))  # true branch first, as written in lax.cond
    retraced = other is None or any(a.jaxpr is not b.jaxpr for a, b in zip(branches, other.params["branches"]))
    return CondSite(location, function, names, retraced)


def _branch_name(branch: Any) -> str:
    info = getattr(branch.jaxpr, "debug_info", None)
    src = getattr(info, "func_src_info", None) or "?"
    found = re.match(r"(.*) at (.*):(\d+)$", src)
    return f"{found.group(1)} at {short_path(found.group(2))}:{found.group(3)}" if found else src


def scan_conds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[CondSite]:
    """The conds in `fn(*args, **kwargs)`'s jaxpr (traced twice, abstractly: nothing runs or compiles).
    A cond whose branch jaxprs differ between the two traces is re-traced on every call."""
    jax = require()
    first = jax.make_jaxpr(lambda *a, **k: fn(*a, **k))(*args, **kwargs)
    second = jax.make_jaxpr(lambda *a, **k: fn(*a, **k))(*args, **kwargs)
    a, b = list(_cond_eqns(first.jaxpr)), list(_cond_eqns(second.jaxpr))
    if len(a) != len(b):
        b = []
    return [_site_of(eqn, b[i] if b else None) for i, eqn in enumerate(a)]


class CondScan:
    """At the end of a window in which something compiled, scans the optimizer update of the loop's
    latest step for conds (two abstract traces of the update)."""

    name = "jax_cond_scan"

    def __init__(self, source: Callable[[], OptimizerCall | None]) -> None:
        self._source = source
        self._compiles = 0

    def begin(self) -> None:
        self._compiles = compile_listener().count

    def end(self, steps: int) -> CondReport | None:
        call = self._source() if compile_listener().count > self._compiles else None
        if call is None:
            return None
        update = call.transformation.update
        try:
            sites = scan_conds(update, call.updates, call.opt_state, call.params)
        except TypeError:  # an update that needs extra arguments (optax's *ExtraArgs): not scanned
            return None
        return CondReport(call.transformation, sites)


# --- rules ------------------------------------------------------------------------------------------

def _rss_part(ev: Evidence, accepted: list[Finding]) -> tuple[str, ...]:
    return (RSS,) if RSS in ev.unexplained(accepted) else ()


def _compiled_along(ev: Evidence, accepted: list[Finding]) -> bool:
    """Did backend compiles keep happening beside a resident growth this investigation confirmed, the
    compile count not being one of its suspects? Each probe is read on a schedule of its own (a count
    read every few samples has few windows yet), so the investigation can open on memory alone; the
    compiles account for it (the executables stay cached) when the count, read by every ladder, rose in
    each half of the window by at least a compile every other step: a loop that compiles, not a burst."""
    if COMPILES in ev.suspects or RSS not in ev.unexplained(accepted) or ev.middle is None:
        return False
    counts = [ladder.after(COMPILES) for ladder in (ev.begin, ev.middle, ev.end)]
    spans = (ev.middle.step - ev.start_step, ev.end_step - ev.middle.step)
    if None in counts:
        return False
    return all(later - earlier >= span / 2 for earlier, later, span in zip(counts, counts[1:], spans))


def _compile_facts(ev: Evidence) -> Record:
    """'jax_compiles grew 8 in 4 steps (2/step)', also for a count that was not a suspect (whose growth
    the evidence does not judge): then read from the ladders at the window's ends."""
    if COMPILES in ev.suspects:
        return ev.describe(COMPILES)
    risen = (ev.end.after(COMPILES) or 0.0) - (ev.begin.after(COMPILES) or 0.0)
    return msg("grew", metric=COMPILES, growth=risen, steps=ev.steps, pace=risen / ev.steps, unit="count",
               trend=None)


def compile_cache(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Backend compiles that keep happening after warm-up: name the function and, where known, why.

    The optimizer's re-traced cond is reported on the compile count, which cond_to_where stops. Any other
    cause is reported on resident memory when it grows (jax.clear_caches can bound it), else on the compile
    count (a finding on another metric, so compiles that go on after clear_cache bounded the memory are not
    taken for the memory coming back; the summary keeps one finding per cause and place, the other as its
    supporting evidence), placed as 'train.py:9' on either. The place is always in the user's code: where
    jax says the function is defined when that is the user's file, else (a framework's wrapper:
    eqx.filter_jit's, in site-packages) the user's line that called it when jax traced or compiled it again
    (found on the stack at that moment).
    Compiles that grew resident memory before their count was suspect are compile_cache too, not
    native_memory."""
    if COMPILES not in ev.unexplained(accepted) and not _compiled_along(ev, accepted):
        return []
    activity: CompileActivity = ev.reports.get("jax_compiles") or CompileActivity({}, [])
    conds: CondReport | None = ev.reports.get("jax_cond_scan")
    rss = _rss_part(ev, accepted)
    facts = [_compile_facts(ev)]
    if activity.functions:
        facts.append(msg("compiled_in_window", functions=activity.rows()))
    if rss:
        facts.append(msg("executables_cached", growth=ev.describe(RSS)))
    if conds and conds.retraced and activity.compiled("cond"):
        site = conds.retraced[0]
        return [ev.finding(
            "compile_cache", COMPILES, location=site.location, subject=conds, explains=(COMPILES, *rss),
            evidence=msg("compile_facts", facts=[*facts, msg("cond_retraced", cond=site.record())]),
            recommendation=msg("jit_the_update"),
        )]
    metric = RSS if rss else COMPILES
    compiled = activity.most_compiled()
    repeated = activity.repeated_miss()
    called = activity.called_at(compiled)
    if repeated is not None:
        miss, count = repeated
        called = miss.called_at or activity.called_at(miss.function) or called
        # where the function is defined when that is the user's code; else (a framework's wrapper defined in
        # site-packages: eqx.filter_jit's) the user's line that calls it
        defined = miss.defined_at if _users(miss.defined_at) else called
        facts.append(msg("traced_again", function=miss.function, count=count, reason=miss.reason))
        if called and called != defined:
            facts.append(msg("called_at", site=called))
        fix = msg("trace_once", function=miss.function)
    else:
        defined = called
        fix = msg("jit_once")
        if called:
            facts.append(msg("compiled_from", function=compiled, site=called))
    bound = msg("clear_caches_bound") if metric == RSS else None
    # where the function is defined in the user's code, else the user's line that calls it ('file.py:12', as
    # every compile_cache finding is placed, on either metric: one cause at one place reads the same, and the
    # summary keeps one finding of it); the compiled function's name only where no line is known
    return [ev.finding(
        "compile_cache", metric, location=defined or compiled, explains=(COMPILES, *rss),
        evidence=msg("compile_facts", facts=facts), recommendation=msg("compile_fix", fix=fix, bound=bound),
    )]


def _users(location: str | None) -> bool:
    """Is 'file.py:12' a line of the user's own code (not a framework's wrapper in site-packages)?"""
    path, _, line = (location or "").rpartition(":")
    return bool(path) and line.isdigit() and is_user_file(path)


def _gained_bytes(growth: "ArrayGrowth", platform: str) -> float:
    return float(sum(size for kind, _, size in growth.rows if kind.endswith(f" on {platform}")))


def _holds_enough(ev: Evidence, growth: "ArrayGrowth", platform: str) -> bool:
    """Counts are judged by what they hold: do the arrays gained in the window, at this rate, matter in
    bytes over the horizon?"""
    rss = ev.specs.get(RSS)
    level = ev.begin.after(RSS) or 0.0
    return is_material("bytes", _gained_bytes(growth, platform) / ev.steps, level, ev.horizon,
                       rss.limit if rss else None)


def live_arrays(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Arrays that accumulate on a platform (kept across steps) and survive gc: one finding per platform,
    on its bytes if they grew, else on its count; on CPU also on resident memory, when that is what grew
    first and the arrays gained in the window account for a third of it: of what the window saw or what
    the suspicion's rate predicts, the smaller (one window can see twice its trend's growth, and the arrays
    fall short of a third of that while they are the leak). Placed at who holds them."""
    found = []
    growth: ArrayGrowth = ev.reports.get("jax_live_arrays") or ArrayGrowth([])
    open_metrics = ev.unexplained(accepted)
    platforms = {m.rsplit("_", 1)[-1] for m in open_metrics if m.startswith("jax_live_")}
    on_cpu = sum(size for kind, _, size in growth.rows if kind.endswith(" on cpu"))
    rss = RSS in open_metrics and ev.survives(RSS) and on_cpu >= 0.3 * min(ev.growth(RSS), ev.expected(RSS)) > 0
    for platform in sorted(platforms | ({"cpu"} if rss else set())):
        pair = (live_bytes(platform), live_count(platform))
        metric = next((m for m in pair if m in open_metrics and ev.survives(m)), None)
        if metric is None and platform == "cpu" and rss:
            metric = RSS
        if metric is None:
            continue
        if metric != pair[0] and _kept_bytes(ev, pair[0], accepted) and (metric == RSS or _holds_enough(ev, growth, platform)):
            metric = pair[0]  # the arrays' own bytes, exact, whichever series opened the investigation
        if metric == pair[1] and not _holds_enough(ev, growth, platform):
            ev.note(metric, msg("scalar_history", growth=ev.describe(metric), size=_gained_bytes(growth, platform)))
            continue
        explains: tuple[str, ...] = (metric, *pair, *([RSS] if platform == "cpu" and rss else []))
        kinds = msg("accumulating", arrays=growth.records()) if growth.rows else None
        # the main holder, and others that hold as much as half of it (not the model's current parameters)
        holders = [h for h in growth.holders if 2 * h.count >= growth.holders[0].count][:3]
        held = msg("held_by", holders=[h.name for h in holders]) if holders else None
        where = msg("store_floats", holder=holders[0].path) if holders else msg("store_floats_anywhere")
        found.append(ev.finding(
            "device_arrays", metric, explains=tuple(dict.fromkeys(explains)),
            location=holders[0].location(ev.reports.get("tracemalloc")) if holders else f"jax.live_arrays({platform!r})",
            evidence=msg("survived_gc", growth=ev.describe(metric), kinds=kinds, held=held),
            recommendation=msg("jax_arrays_kept", where=where),
        ))
    return found


def _kept_bytes(ev: Evidence, metric: str, accepted: list[Finding]) -> bool:
    """Did the window's ladders see the platform's live bytes keep growth (a suspect that survived, or
    another series that grew in both halves), with no finding explaining them yet?"""
    return metric in ev.specs and not ev.explained(metric, accepted) and ev.kept(metric) > 0


# --- the integration --------------------------------------------------------------------------------

def integration(optimizer: Callable[[], OptimizerCall | None] | None = None) -> Integration:
    """JAX probes, forensics, the compile-cache clear and the JAX rules. `optimizer` returns the
    optimizer update of the current step (or None) for the cond scan."""
    jax = require()
    forensics: list[Any] = [CompileLog(), LiveArrayDiff()]
    if optimizer is not None:
        forensics.append(CondScan(optimizer))
    return Integration(
        name="jax",
        probes=[compile_probe(), live_array_probe()],
        forensics=forensics,
        cleanups=[Cleanup("clear_compile_cache", jax.clear_caches, in_ladder=False)],
        rules=[Rule(20, compile_cache), Rule(30, live_arrays)],
    )
