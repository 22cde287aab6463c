"""One walk of the heap for the forensics that begin (or end) together.

The type census counts every object, the tensor census and MLX's array census look for the live instances
of one type: each walked the heap (`gc.get_objects()`) on its own, at a tenth of a second to seconds in a
large process. Within `one_walk()` (an investigation's begin and end) they share one list. The instances of
a type are picked out by C-level iteration (no Python code and no allocation per object), so the walk costs
the same whether or not tracemalloc traces allocations meanwhile.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from itertools import compress
from typing import Any, Iterator

_open: list[bool] = []  # one entry while a one_walk() is open
_shared: list[list[Any]] = []  # the list of the open one_walk(), once taken


@contextmanager
def one_walk() -> Iterator[None]:
    """Share one list of the live objects among the walks made within (let go at the end)."""
    _shared.clear()
    _open.append(True)
    try:
        yield
    finally:
        _open.clear()
        _shared.clear()


def objects() -> list[Any]:
    """Every object the garbage collector tracks: within a one_walk(), its list, taken on first use."""
    if not _open:
        return gc.get_objects()
    if not _shared:
        _shared.append(gc.get_objects())
    return _shared[0]


def instances(base: type, among: list[Any] | None = None) -> list[Any]:
    """Every live instance of `base` (subclasses included). The subclass test runs once per type present."""
    found = objects() if among is None else among
    types = {cls for cls in set(map(type, found)) if issubclass(cls, base)}
    return list(compress(found, map(types.__contains__, map(type, found))))
