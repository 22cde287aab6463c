"""Who holds objects that accumulate from step to step, in the user's terms: a local variable of the
training loop, a global, an attribute of the model or of one of the user's objects (and the containers
among those, two deep), with the line of the user's code that stores into it. Found by looking at the
places the user's program keeps things, from the frame of the training loop outwards, for a sample of
the objects kept. Framework-free: torch's retained graphs and JAX's kept arrays both ask it.
"""

from __future__ import annotations

import functools
import gc
import inspect
import sys
import types
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from leakdoctor._base.messages import Record, msg
from leakdoctor._base.source import (calling_line, frame_locals, is_engine_module, is_user_file, short_path,
                                     stored_value, storing_line)
from leakdoctor.integrations import _heap as heap


class AllocationSite(Protocol):
    """One allocation site that grew: its 'file:line', whether the file is the user's, how many blocks."""

    location: str
    user: bool
    count: int


class GrownSites(Protocol):
    """What `Holder.location` reads of the allocation sites that grew during a window (_python.py's
    AllocationGrowth, which builds on this module: so this one names what it reads instead of importing it)."""

    @property
    def sites(self) -> Sequence[AllocationSite]: ...

#: The containers looked into (and through) for what they hold.
CONTAINERS = (list, dict, set, frozenset, tuple, deque)

#: A file and its lines first to last: a class, a function, a module.
Region = tuple[str, int, int]


def live_instances(base: type) -> list[Any]:
    """Every live instance of `base` (heap.instances: within an investigation's begin or end, one walk of
    the heap shared with the other forensics)."""
    return heap.instances(base)


@dataclass
class Holder:
    """Who keeps the objects: `path` ("val_losses", "LitModel.outputs", "global LOSSES") within `scope`
    (" in train()" for a local variable), how many of them it holds, the code regions where to look for
    the line that stores them (the loop's function, then the class of the object whose attribute it is),
    and access for remedies (detach_retained): `get` returns the live container
    or object; `rebind` replaces it where that is possible (attributes, globals; not a function's local
    variables). `via` is the user's variable through which a library's object that keeps them is reached
    (`log` of "MemoryHandler.buffer of global log"): the line that hands it what it keeps calls it."""

    path: str
    scope: str
    count: int
    regions: tuple[Region, ...]
    line: int
    get: Callable[[], Any]
    rebind: Callable[[Any], None] | None = None
    via: str | None = None

    @property
    def name(self) -> str:
        return self.path + self.scope

    @property
    def variable(self) -> str:
        """The name the code stores into: `outputs` of "LitModel.outputs", `LOSSES` of "global LOSSES"."""
        return self.path.rpartition(".")[2].removeprefix("global ")

    def stored(self) -> str | None:
        """The code of what the holder's code stores into it (`out.mean()`, `loss`), where it can be read."""
        return next((value for path, first, last in self.regions
                     if (value := stored_value(path, first, last, self.variable)) is not None), None)

    def location(self, allocations: GrownSites | None = None) -> str:
        """'val_losses in train() (train.py:42)': the line of the holder's code that stores into it
        (`val_losses.append(...)`, `self.outputs[k] = ...`, `total += ...`); else the line inside it that
        gained the most live allocations during the investigation (one per kept object, every window
        alike); else where that code stands now."""
        name = self.variable
        for path, first, last in self.regions:
            line = storing_line(path, first, last, name) if self.via is None else calling_line(path, first, last,
                                                                                              self.via)
            if line is not None:
                return f"{self.name} ({short_path(path)}:{line})"
        path, first, last = self.regions[0]
        inside = []
        for site in allocations.sites if allocations else []:
            file, _, number = site.location.rpartition(":")
            if site.user and file == short_path(path) and first <= int(number) <= last:
                inside.append((-site.count, int(number)))
        return f"{self.name} ({short_path(path)}:{min(inside)[1] if inside else self.line})"


def find_holders(kept: Sequence[Any], roots: Sequence[Any], frame: Any) -> list[Holder]:
    """Who holds the `kept` objects: attributes of the roots (and of user objects they hold), then local
    variables and globals of the user's frames from `frame` outwards. Those holding most first; each
    container once."""
    ids = {id(t) for t in kept}
    found: dict[int, tuple[int, float, Holder]] = {}
    try:
        for path, scope, value, origins, get, rebind in places(roots, frame):
            count, depth = _holds(value, ids)
            if count and id(value) not in found:
                regions, line = _regions(*origins)
                found[id(value)] = (-count, depth, Holder(path, scope, count, regions, line, get, rebind))
        # most held first; of two holding as many, the nearer one (the list itself before an object that has it)
        holders = [holder for *_, holder in sorted(found.values(), key=lambda f: f[:2])]
        return [_narrowed(holders[0], ids), *holders[1:]] if holders else []
    finally:
        _is_program.cache_clear()  # holds the types it saw: none outlives the search


def _narrowed(holder: Holder, ids: set[int]) -> Holder:
    """The holder, or the attribute of an object inside it that holds all it holds: a list of callbacks is
    named by the callback's attribute that keeps the objects (Logger.predictions). Inside a library's
    object (a logger's MemoryHandler) the attribute is named as reached from the user's variable, whose
    code regions stay where the line is looked for."""
    value, place = holder.get(), holder
    for _ in range(DEPTH):
        if _named(value):
            attrs = [(a, v) for a, v in vars(value).items() if _holds(v, ids)[0] >= holder.count]
            if not attrs:
                return holder
            owner, (attr, value) = value, attrs[0]
            ref = weakref.ref(owner)
            get, rebind = (lambda a=attr: getattr(ref(), a, None)), (lambda v, a=attr: setattr(ref(), a, v))
            path = f"{type(owner).__qualname__}.{attr}"
            if _searchable(owner):
                regions, line = _regions(type(owner))
                holder = Holder(path, "", holder.count, regions, line, get, rebind)
            else:  # a library's object: named from the user's place, and left alone by the remedies
                holder = Holder(path, f" of {place.name}", holder.count, place.regions, place.line, get, None,
                                place.via or place.variable)
        elif isinstance(value, CONTAINERS):
            items = list(value.values() if isinstance(value, dict) else value)
            if any(id(item) in ids for item in items):  # it holds them itself: no item is a nearer place
                return holder
            value = next((v for v in items if _holds(v, ids)[0] >= holder.count), None)
        else:
            return holder
    return holder


def _named(obj: Any) -> bool:
    """An object whose attributes name what it holds: any with a __dict__ that takes weakrefs, other than
    classes, modules and functions."""
    if not hasattr(obj, "__dict__") or inspect.isclass(obj) or inspect.ismodule(obj) or inspect.isroutine(obj):
        return False
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


#: (path, scope, value, origins: the frame, the owner's class, the module's globals, where the code that stores
#: into the place may be, get, rebind) of a place that may hold objects.
Place = tuple[str, str, Any, tuple[Any, ...], Callable[[], Any], "Callable[[Any], None] | None"]


def places(roots: Sequence[Any], frame: Any) -> Iterator[Place]:
    """Every place the user's program keeps things: attributes of the roots (of each of a torch module's
    submodules), then the variables of the user's frames from `frame` outwards (and attributes of the
    user's objects among them), and their modules' globals. The doctor's own objects are no such place
    (searching the doctor's series and clinic took a third of a tensor census's end)."""
    return (place for place in _places(roots, frame) if not _ours(place[2]))


def _ours(value: Any) -> bool:
    """Is `value` one of leakdoctor's own objects (the user's doctor among them)?"""
    module = getattr(type(value), "__module__", None)
    return isinstance(module, str) and is_engine_module(module)


def _places(roots: Sequence[Any], frame: Any) -> Iterator[Place]:
    for root in roots:
        for module in root.modules() if callable(getattr(root, "modules", None)) else [root]:
            for path, value, get, rebind in _attributes(module, type(module).__qualname__, depth=2):
                yield path, "", value, (type(module),), get, rebind
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
        yield name, scope, value, (frame,), _local_getter(frame.f_code, name, value), None
        for path, inner, get, rebind in _attributes(value, name, depth=1):
            yield path, scope, inner, (frame, type(value)), get, rebind


def _globals(frame: Any) -> Iterator[Place]:
    namespace = frame.f_globals
    for name, value in list(namespace.items()):
        yield (f"global {name}", "", value, (namespace,), lambda n=name: namespace.get(n),
               lambda v, n=name: namespace.__setitem__(n, v))


def _regions(*origins: Any) -> tuple[tuple[Region, ...], int]:
    """The code regions of the origins, and the line to name (the first's) when no line is found in them."""
    regions = [_region(origin) for origin in origins]
    return tuple(region for region, _ in regions), regions[0][1]


def _region(origin: Any) -> tuple[Region, int]:
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
    if not _named(obj):
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


def _local_getter(code: Any, name: str, value: Any) -> Callable[[], Any]:
    """A local variable's value now: in the newest call of its function on the stack (the loop's function
    called again, each epoch a new frame whose variable holds a new running total), else the value seen."""
    seen = _getter(value)

    def get() -> Any:
        frame = sys._getframe(1)
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        return seen() if frame is None else frame_locals(frame).get(name)

    return get


#: How deep a place is searched for the kept objects: a list of pytrees (a list of flax States: State,
#: a Param, the array) is three levels; a logger's buffered records (the logger, its handlers, the
#: MemoryHandler, its buffer, a record, its args, the tensor) six.
DEPTH = 6
#: Objects looked at per place at most, so that searching a large object (a model, a dataset) stays cheap.
BUDGET = 20_000


def _holds(value: Any, ids: set[int]) -> tuple[int, float]:
    """How many of the objects (by id) `value` is or holds, looking DEPTH levels into containers and into
    the objects of a pytree (dataclasses, flax States, equinox Modules: whatever the garbage collector
    sees them hold, read without running their code); and how deep they are on average."""
    if id(value) in ids:
        return 1, 0.0
    count, total, seen = 0, 0, {id(value)}
    level = [value] if _enterable(value) else []
    for depth in range(1, DEPTH + 1):
        inner: list[Any] = []
        for item in (item for obj in level for item in _contents(obj)):
            if type(item) in _ATOMS:  # holds nothing and is kept by no one: no id() (an allocation) for it
                continue
            key = id(item)
            if key in seen:
                continue
            seen.add(key)
            if key in ids:
                count, total = count + 1, total + depth
                if count == len(ids):  # it holds them all: nothing more to find
                    return count, total / count
            elif _enterable(item):
                inner.append(item)
            if len(seen) > BUDGET:  # a large place (a list of 200,000 records) is looked into only so far
                break
        if len(seen) > BUDGET:
            break
        level = inner
    return count, total / count if count else 0.0


#: Values that hold no object: skipped by the search without a look (an id() allocates an int, which
#: tracemalloc, tracing during an investigation, makes dear).
_ATOMS = frozenset({int, float, bool, str, bytes, type(None), complex})


def _contents(obj: Any) -> list[Any]:
    """What `obj` holds: a container's items, an instance's attributes (its __dict__ is no level of its
    own) and whatever else the garbage collector sees it hold."""
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, CONTAINERS):
        return list(obj)
    inner = getattr(obj, "__dict__", None)
    if type(inner) is dict:
        return [*inner.values(), *(r for r in gc.get_referents(obj) if r is not inner)]
    return gc.get_referents(obj)


def _enterable(obj: Any) -> bool:
    """Containers and gc-tracked objects other than code, classes and modules (whose referents are the
    program itself, not its data)."""
    if isinstance(obj, CONTAINERS):
        return True
    return gc.is_tracked(obj) and not _is_program(type(obj))


@functools.lru_cache(maxsize=4096)
def _is_program(kind: type) -> bool:
    """Are objects of this type the program itself (classes, modules, routines, frames, code, weak
    references)? inspect's tests look at the type alone, and are dear to run for every object a search
    meets: asked once per type and search (find_holders empties the cache)."""
    return (issubclass(kind, (type, types.ModuleType, types.FrameType, types.CodeType, weakref.ref))
            or _routine_type(kind))


def _routine_type(kind: type) -> bool:
    """inspect.isroutine, for the objects of `kind`: functions, methods, builtins, method descriptors and
    wrappers."""
    if issubclass(kind, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.MethodWrapperType)):
        return True
    return hasattr(kind, "__get__") and not hasattr(kind, "__set__") and not issubclass(kind, type)


def keep_instead(value: str, sample: Any = None) -> Record:
    """What to keep instead of `value` (the code the user stores), a tensor with its autograd graph, as a fix
    text: `value.item()` only for a one-element tensor (it raises on a larger one); for a larger one
    `value.detach()` or a summary statistic; where no kept tensor could be read (`sample` None), both with
    the condition. `sample` is one of the kept tensors (any framework's: it has `numel()` or `size`)."""
    elements = _elements(sample)
    if elements == 1:
        return msg("keep_scalar", value=value)
    if elements is not None:
        return msg("keep_detached", value=value)
    return msg("keep_either", value=value)


def _elements(sample: Any) -> int | None:
    """The number of elements of a tensor or array (torch's numel(), NumPy's and JAX's size); None if unknown."""
    try:
        numel = getattr(sample, "numel", None)
        count = numel() if callable(numel) else getattr(sample, "size", None)
        return int(count) if isinstance(count, int) or hasattr(count, "__index__") else None
    except Exception:  # a broken object's attributes must not break the diagnosis
        return None
