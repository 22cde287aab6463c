"""Out of memory: recognising the error a run dies of, and the post-mortem its summary carries.

When a run ends with an out-of-memory error, the summary says so first (`"oom": {"step", "error"}`),
with what was growing up to the last step (the fastest-growing byte series, measured on their history
whether or not an investigation concluded) and the allocation sites the investigations saw grow
(tracemalloc lines, the tensor census's kept tensors). With `oom_snapshot=path` on CUDA, the caching
allocator records its history from the start and the snapshot is dumped at the OOM, for PyTorch's
memory_viz (https://pytorch.org/memory_viz), as Composer's OOMObserver does.

The out-of-memory killer gives no such chance (SIGKILL): when resident memory passes `oom_watermark` of
the memory limit, heartbeat.py writes the post-mortem at once, with the entry `imminent` builds here.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leakdoctor._base.messages import Record, msg
from leakdoctor._base.trend import theil_sen
from leakdoctor._judging.sites import SITES
from leakdoctor._reading.monitor import Monitor
from leakdoctor.reporting.summary import Summary

if TYPE_CHECKING:
    from leakdoctor.integrations._limits import Limit

#: Exception classes (by name, anywhere in the class's MRO) that mean memory ran out: Python's and
#: numpy's MemoryError, torch's OutOfMemoryError (CUDA, and torch.OutOfMemoryError), TensorFlow/Keras's
#: ResourceExhaustedError.
TYPES = frozenset({"MemoryError", "OutOfMemoryError", "ResourceExhaustedError"})
#: Messages of RuntimeErrors that mean memory ran out: torch's CPU allocator ("DefaultCPUAllocator:
#: can't allocate memory", "not enough memory"), CUDA/MPS ("out of memory"), XLA ("RESOURCE_EXHAUSTED"),
#: MLX ("[malloc] Unable to allocate", "[metal::malloc] ..."). Lower case.
MESSAGES = ("can't allocate memory", "not enough memory", "out of memory", "resource_exhausted",
            "[malloc] unable to allocate", "[metal::malloc]")
#: Series a post-mortem keeps (and SITES, the sites: _judging/sites.py).
GROWING = 3
#: History points (the most recent) on which the growth of each series is measured.
TAIL = 128
#: The address space a doctor holds for its own last words (Reserve).
RESERVE = 4 * 2**20


def is_oom(exception: BaseException | None) -> bool:
    """Did memory run out? The exception, or one it was raised from or during."""
    seen: set[int] = set()
    while exception is not None and id(exception) not in seen:
        seen.add(id(exception))
        if TYPES & {cls.__name__ for cls in type(exception).__mro__}:
            return True
        if isinstance(exception, RuntimeError) and any(m in str(exception).lower() for m in MESSAGES):
            return True
        if isinstance(exception, OSError) and exception.errno == errno.ENOMEM:
            return True
        exception = exception.__cause__ or exception.__context__
    return False


def uncaught() -> BaseException | None:
    """The exception that ended the program, at interpreter exit (None if it ended normally)."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def error_text(exception: BaseException) -> str:
    """'MemoryError: Unable to allocate 8.00 MiB ...' (first line, at most 500 characters)."""
    text = str(exception).strip().splitlines()
    return f"{type(exception).__name__}: {text[0][:500] if text else ''}".rstrip(": ")


def growing(monitor: Monitor) -> list[dict[str, Any]]:
    """The byte series that grew over their recent history (warm-up included: a run may die in it),
    fastest first; not a series that only counts another one again as the limit counts it (a cgroup's
    charge, which covers resident memory: the post-mortem records it as the limit's figure)."""
    rows = []
    for name, series in monitor.series.items():
        if series.spec.unit != "bytes" or series.spec.covers:
            continue
        steps, values = series.history()
        steps, values = steps[-TAIL:], values[-TAIL:]
        if len(values) < 3:
            continue
        slope = theil_sen(steps, values)[0]
        if slope > 0:
            rows.append({"metric": name, "slope_per_step": slope, "since_step": int(steps[0]),
                         "end": float(values[-1])})
    return sorted(rows, key=lambda r: r["slope_per_step"], reverse=True)[:GROWING]


def post_mortem(summary: Summary, exception: BaseException | None, step: int, sites: list[dict[str, Any]],
                monitor: Monitor, snapshot: "Snapshot") -> Summary:
    """The summary with its `oom` entry when `exception` is an out-of-memory error (and the CUDA snapshot
    dumped, if asked for); the summary unchanged otherwise."""
    notes = [snapshot.note] if snapshot.note else []
    if not is_oom(exception):
        snapshot.stop()
        return dataclasses.replace(summary, notes=summary.notes + notes) if notes else summary
    assert exception is not None
    record = {"step": step, "error": error_text(exception), "growing": growing(monitor), "sites": sites[:SITES]}
    dumped = snapshot.dump()
    if dumped:
        record["snapshot"] = dumped
    return dataclasses.replace(summary, oom=record, notes=summary.notes + notes)


def imminent(step: int, used: float, limit: Limit, sites: list[dict[str, Any]], monitor: Monitor,
             investigating: list[str]) -> dict[str, Any]:
    """The `oom` entry of a post-mortem written before memory runs out (heartbeat.py, `oom_watermark`):
    the figure the limit is compared with (`limit.figure`: resident memory, a cgroup's charge) read `used`,
    past the watermark of the limit, at `step`; resident memory too, as its series last read it. The
    out-of-memory killer's SIGKILL leaves no chance to write later, so it holds what an `oom` entry after
    the error holds (what grew, the sites seen), with the suspects of an investigation still open."""
    resident = monitor.series.get("rss_bytes")
    record: dict[str, Any] = {"imminent": True, "step": step, "rss_bytes": float(used), limit.figure: float(used),
                              "figure": limit.figure, "limit_bytes": float(limit.bytes),
                              "limit_source": limit.source, "growing": growing(monitor), "sites": sites[:SITES]}
    if limit.figure != "rss_bytes":
        record["rss_bytes"] = float(resident.end) if resident is not None and resident.end is not None else None
    if investigating:
        record["investigating"] = sorted(investigating)
    return record


class Reserve:
    """Address space held from the doctor's start and let go of when memory ran out (`release`), so that
    the summary and the post-mortem (a few small arrays) can be built where the run's last allocation
    failed: under RLIMIT_AS, none is left then. An anonymous mapping never touched: no resident memory."""

    def __init__(self, size: int = RESERVE) -> None:
        self._block: mmap.mmap | None = mmap.mmap(-1, size)

    def release(self) -> None:
        block, self._block = self._block, None
        if block is not None:
            block.close()


class Snapshot:
    """`oom_snapshot=path`: on CUDA, record the caching allocator's history from the doctor's start
    (torch.cuda.memory._record_memory_history) and dump it at an out-of-memory error; elsewhere a note
    says that nothing is recorded."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.note: Record | None = None
        self._memory: Any = None
        if path is None:
            return
        try:
            import torch
        except ImportError:
            self.note = msg("snapshot_needs_torch", path=str(path))
            return
        if not torch.cuda.is_available():
            self.note = msg("no_cuda_snapshot", path=str(path))
            return
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._memory = torch.cuda.memory

    def dump(self) -> str | None:
        """Write the snapshot to the path; stop recording."""
        if self._memory is None:
            return None
        try:
            self._memory._dump_snapshot(str(self.path))
        finally:
            self.stop()
        return str(self.path)

    def stop(self) -> None:
        if self._memory is not None:
            memory, self._memory = self._memory, None
            memory._record_memory_history(enabled=None)
