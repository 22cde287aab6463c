"""How much of a Python container forked child processes have copied (copy-on-read, pytorch#13246), for
a fraction of a millisecond: a forked DataLoader worker shares its parent's pages until it writes one,
and reading a Python object writes its reference count. /proc/PID/pagemap tells, page by page, whether a
page is present and mapped by that process alone (bit 56, Linux 4.2+): a page of the dataset's objects
that the worker maps alone is one it copied. Counting that over a sample of the pages that hold the
container's items (the probe: a few small reads) or over all of them (an investigation: a few ms) is
cheap, where the worker's USS (smaps_rollup walks every page it maps) costs tens of milliseconds. The
items' addresses are read from the container's own pointer array, so no item is touched: a reference
count written here would copy the page in this process instead.

Linux and CPython lists and tuples only; `ItemPages.of` returns None elsewhere.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: The probe's sample: runs of pagemap spread over the item pages, and pages per run (4 reads of 1 KiB).
SLICES = 4
SLICE_PAGES = 128
_PRESENT, _EXCLUSIVE = np.uint64(1 << 63), np.uint64(1 << 56)


def item_addresses(container: Any) -> np.ndarray | None:
    """Addresses of a list's or tuple's items, read from its pointer array without touching the items;
    None for other containers or interpreters."""
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux") or not len(container):
        return None
    n, width = len(container), ctypes.sizeof(ctypes.c_void_p)
    if type(container) is list:
        # PyListObject ends with `PyObject **ob_item; Py_ssize_t allocated;`
        start = ctypes.c_void_p.from_address(id(container) + list.__basicsize__ - 2 * width).value
    elif type(container) is tuple:
        start = id(container) + tuple.__basicsize__  # the items follow the header
    else:
        return None
    if not start:
        return None
    addresses = np.frombuffer(ctypes.string_at(start, n * width), dtype=np.uintp).astype(np.uint64)
    # the layout is the expected one (this touches one item: one page copied here, not in the workers)
    return addresses if int(addresses[-1]) == id(container[-1]) else None


@dataclass(frozen=True)
class Spans:
    """Runs of pagemap to read (first page, pages), and where the pages of interest lie in the entries
    read one run after another."""

    runs: list[tuple[int, int]]
    index: np.ndarray

    @classmethod
    def covering(cls, pages: np.ndarray, gap: int) -> "Spans":
        """Runs that cover sorted `pages`, a new run wherever two pages lie more than `gap` apart."""
        breaks = np.flatnonzero(np.diff(pages) > gap) + 1
        runs, index, read = [], [], 0
        for part in np.split(pages, breaks):
            runs.append((int(part[0]), int(part[-1] - part[0] + 1)))
            index.append(read + part - part[0])
            read += runs[-1][1]
        return cls(runs, np.concatenate(index))


@dataclass
class ItemPages:
    """The distinct pages holding a container's items: a sample of them, a few short runs of pagemap
    spread over the items (for the probe's reads), and all of them (for an investigation's)."""

    pages: np.ndarray  # sorted page numbers
    sample: Spans
    full: Spans

    @classmethod
    def of(cls, container: Any) -> "ItemPages | None":
        addresses = item_addresses(container)
        if addresses is None:
            return None
        pages = np.sort((addresses // np.uint64(PAGE)).astype(np.int64))
        pages = pages[np.concatenate(([True], pages[1:] != pages[:-1]))]  # distinct (np.unique hashes: slower)
        chosen = [part[part < part[0] + SLICE_PAGES] for part in np.array_split(pages, min(SLICES, len(pages)))]
        sample = Spans.covering(np.concatenate(chosen), gap=SLICE_PAGES)  # disjoint parts, spread over the items
        return cls(pages, sample, Spans.covering(pages, gap=SLICE_PAGES))

    @property
    def nbytes(self) -> int:
        return len(self.pages) * PAGE

    def copied_bytes(self, pid: int, exact: bool = False) -> float | None:
        """Bytes of the item pages that process `pid` maps alone (copied): estimated from the sample, or
        counted over all of them; None when its pagemap cannot be read (it exited, or access is denied)."""
        spans = self.full if exact else self.sample
        try:
            fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = b"".join(os.pread(fd, 8 * count, 8 * first) for first, count in spans.runs)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(raw) < 8 * sum(count for _, count in spans.runs):
            return None
        flags = np.frombuffer(raw, dtype=np.uint64)[spans.index]
        copied = np.count_nonzero(((flags & _PRESENT) != 0) & ((flags & _EXCLUSIVE) != 0))
        return float(copied) / len(spans.index) * self.nbytes
