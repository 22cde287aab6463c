"""Process-level knowledge: resident memory (against the memory limit that _limits.py finds)
and, for the cleanup ladder, what backs it (malloc's bytes in use, the mapped size); worker-process
memory, glibc's malloc_trim, and the dataloader_workers diagnosis. psutil makes it portable; on Linux
the RSS read takes a fast path (one pread of /proc/self/statm, 2 µs against psutil's 25 µs) because it
runs on nearly every step of the user's loop."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import re
import sys
import threading
import time
import tracemalloc
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import psutil

from leakdoctor._base.evidence import ACCOUNTED, HEAP, MAPPED, Evidence, Rule
from leakdoctor._base.messages import msg
from leakdoctor._base.integration import Cleanup, Integration
from leakdoctor._base.metric import MetricSpec
from leakdoctor.integrations._private import PrivateMemory

#: The bytes of the blocks that objects use in Python's small-object arenas (a triage's counter: what a
#: growth of small Python objects keeps, which malloc's bytes in use do not count).
PYTHON = "python_bytes"
from leakdoctor._base.findings import Finding
from leakdoctor.integrations import _limits as limits


#: Forked children so far in this process's line (bumped in each child): a reader opened before a fork
#: holds the parent's /proc/<pid>/statm and must reopen. Cheaper to compare than os.getpid() per read.
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1
    _statm.forget()


class _SharedStatm:
    """One descriptor of /proc/self/statm for all the readers of this process (a doctor each, and its
    sampler thread through the same reader): opened by the first reader that reads, closed when the last
    one closes, so that doctors kept alive but never finished hold one descriptor between them, not one
    each (250 of them exhausted `ulimit -n 256`)."""

    def __init__(self) -> None:
        self.fd = -1
        self.users = 0
        self.lock = threading.Lock()

    def acquire(self) -> int:
        """The shared descriptor (opened now if none is), counted as one more user; -1 if it cannot be
        opened (no descriptors left)."""
        with self.lock:
            if self.fd < 0:
                try:
                    self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return -1
            self.users += 1
            return self.fd

    def release(self, fd: int) -> None:
        """One user less of `fd`; the last closes it. A descriptor that is no longer the shared one (a
        fork's, or one replaced after it broke) is left alone."""
        with self.lock:
            if fd != self.fd or self.users <= 0:
                return
            self.users -= 1
            if self.users == 0:
                self.fd = -1
                os.close(fd)

    def broken(self, fd: int) -> None:
        """`fd` failed to read (closed behind our back, os.closerange): the next acquire opens a new one;
        its users reacquire."""
        with self.lock:
            if fd == self.fd:
                self.fd, self.users = -1, 0

    def forget(self) -> None:
        """In a forked child: the inherited descriptor reads the parent's statm; closed, and the count
        starts afresh (a new lock: the parent's may have been held by a thread that did not come along)."""
        fd, self.fd, self.users, self.lock = self.fd, -1, 0, threading.Lock()
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


_statm = _SharedStatm()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class RssReader:
    """This process's resident set size in bytes, as a callable. On Linux, one pread of /proc/self/statm
    through the process's shared descriptor (_SharedStatm), taken on first use, again after a fork (the
    inherited one reads the parent) and after `close()`, which the doctor calls at finish so that no
    descriptor outlives the last doctor; psutil elsewhere, or when the descriptor cannot be opened (no fds
    left under `ulimit -n`)."""

    def __init__(self) -> None:
        self._fd = -1
        self._forks = -1
        self._page = 0
        self._process: psutil.Process | None = None
        self._opening = threading.Lock()

    def __call__(self) -> float:
        if self._forks == _forks:
            try:
                return float(int(os.pread(self._fd, 128, 0).split()[1]) * self._page)
            except OSError:  # the descriptor was closed behind our back (os.closerange): reopen
                _statm.broken(self._fd)
                self._forks = -1
        return self._open()

    def mapped(self) -> float:
        """This process's mapped address space (VmSize) in bytes, for the cleanup ladder: the first field
        of the same statm read, psutil's vms elsewhere."""
        self()  # opens the descriptor (again, after a fork or close()), or settles on psutil
        if self._fd >= 0:
            return float(int(os.pread(self._fd, 128, 0).split()[0]) * self._page)
        return float(self._psutil().memory_info().vms)

    def _open(self) -> float:
        with self._opening:  # two threads read through one reader (the sampler thread's): one opens it
            if self._forks != _forks:
                self.close()  # in a forked child, the inherited copy of the parent's descriptor
                if sys.platform.startswith("linux"):
                    self._fd = _statm.acquire()  # shared with the process's other readers
                    if self._fd >= 0:
                        self._page, self._forks = os.sysconf("SC_PAGE_SIZE"), _forks
            fd = self._fd
        if fd >= 0:
            return float(int(os.pread(fd, 128, 0).split()[1]) * self._page)
        return float(self._psutil().memory_info().rss)

    def _psutil(self) -> psutil.Process:
        if self._process is None or self._process.pid != os.getpid():
            self._process = psutil.Process()
        return self._process

    def close(self) -> None:
        """Let go of the shared descriptor (the last reader closes it); the next read takes it again."""
        fd, forks, self._fd, self._forks = self._fd, self._forks, -1, -1
        if fd >= 0 and forks == _forks:  # a fork's inherited one was closed in the child (_forked)
            _statm.release(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit os may be gone already
            pass


class RssProbe:
    """Resident memory, less tracemalloc's own memory while an investigation traces allocations. The
    cleanup ladder also reads what backs it (`read_now`): malloc's bytes in use and the mapped address
    space, by which an investigation tells memory newly allocated from pages that the allocator touches
    again after a ladder's malloc_trim returned them (Evidence.refilled). The mapped size leaves out
    what Python's small-object arenas map beyond the objects in them (python_slack): a few hundred objects
    that come and go map 1 MiB at a time, more than a window of steps refaults. While tracemalloc traces
    (the middle of an investigation's window), that slack cannot be read, and the last one read stands.
    Malloc's bytes in use and the bytes Python's objects use in its arenas (`python_bytes`) are also what
    confirms a suspicion of resident memory before an investigation (_judging/triage.py): a growth that
    keeps memory shows in one of them; one that touches pages again, or maps address space, does not."""

    name = "rss"
    every = 1
    essential = True  # read on every sample: what the sample is for (probing.py)
    metrics = ("rss_bytes",)
    confirms = (HEAP, PYTHON)

    def __init__(self, limit: float | None) -> None:
        self._read = RssReader()
        self._heap = malloc_in_use()
        self._arenas = python_arenas()
        self._last_slack = 0.0
        backing = (HEAP, PYTHON) if self._heap is not None and self._arenas is not None else ()
        self._specs = {"rss_bytes": MetricSpec("rss_bytes", "bytes", limit=limit, source="process",
                                               confirmed_by=backing),
                       HEAP: MetricSpec(HEAP, "bytes", source="process"),
                       MAPPED: MetricSpec(MAPPED, "bytes", source="process"),
                       PYTHON: MetricSpec(PYTHON, "bytes", source="process")}

    def read(self) -> Mapping[str, float]:
        value = self._read()
        if tracemalloc.is_tracing():
            value -= tracemalloc.get_tracemalloc_memory()
        return {"rss_bytes": value}

    def read_now(self) -> Mapping[str, float]:
        traced = tracemalloc.get_tracemalloc_memory() if tracemalloc.is_tracing() else 0
        readings = {"rss_bytes": self._read() - traced}
        arenas = self._arenas() if self._arenas is not None else (0.0, 0.0)
        if arenas is not None:  # unknown while tracing: the last slack stands, and Python's bytes are not read
            self._last_slack = arenas[0] - arenas[1]
            readings[PYTHON] = arenas[1]
        readings[MAPPED] = self._read.mapped() - traced - self._last_slack
        if self._heap is not None:
            readings[HEAP] = self._heap() - traced
        return readings

    def close(self) -> None:
        self._read.close()

    def thread_reader(self) -> "ResidentReader":
        """A reader of resident memory for the sampler thread (_reading/thread.py)."""
        return ResidentReader(self._read)

    def spec(self, metric: str) -> MetricSpec:
        return self._specs[metric]


class CgroupProbe:
    """The charge of the cgroup whose memory limit is the process limit (`cgroup_bytes`: v2 `memory.current`,
    v1 `memory.usage_in_bytes`), the figure that limit is compared with (_limits.py): it counts
    the page cache the process writes and kernel memory, which resident memory leaves out, and not the
    file-backed pages that resident memory counts and another cgroup was charged for. One pread of the file
    through a descriptor opened on first use (a few µs); supporting evidence, never a suspicion of its own
    (page cache comes and goes): a leak found on resident memory is projected onto it (`covers`)."""

    name = "cgroup"
    every = 1
    essential = True  # read on every sample: the limit's own figure, which on_limit and the watermark read
    metrics = (limits.CHARGE,)

    def __init__(self, path: str, limit: float) -> None:
        self._path = path
        self._fd = -1
        self._spec = MetricSpec(limits.CHARGE, "bytes", role="supporting", limit=limit, source="process",
                                where=path, covers="rss_bytes")

    def read(self) -> Mapping[str, float]:
        if self._fd < 0:
            self._fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return {limits.CHARGE: float(int(os.pread(self._fd, 64, 0)))}

    def read_now(self) -> Mapping[str, float]:
        return self.read()

    def spec(self, metric: str) -> MetricSpec:
        return self._spec

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class AddressSpaceProbe:
    """The address space (`vms_bytes`, the first field of the statm read resident memory's reader takes),
    the figure RLIMIT_AS is compared with (integrations/_limits.py): the kernel refuses a mapping, touched or
    not, once it would pass the limit, so reservations count here although they cost no memory.
    Supporting evidence, never a suspicion of its own (reservations come and go): a leak found on resident
    memory is projected onto it (`covers`)."""

    name = "address_space"
    every = 1
    essential = True  # read on every sample: the limit's own figure, which on_limit and the watermark read
    metrics = (limits.ADDRESS,)

    def __init__(self, limit: float) -> None:
        self._read = RssReader()
        self._spec = MetricSpec(limits.ADDRESS, "bytes", role="supporting", limit=limit, source="process",
                                where="RLIMIT_AS", covers="rss_bytes")

    def read(self) -> Mapping[str, float]:
        return {limits.ADDRESS: self._read.mapped()}

    def read_now(self) -> Mapping[str, float]:
        return self.read()

    def spec(self, metric: str) -> MetricSpec:
        return self._spec

    def close(self) -> None:
        self._read.close()


class ResidentReader:
    """`rss_bytes` as RssProbe.read reads it (less tracemalloc's own memory while it traces), as a
    callable for the sampler thread, through the probe's reader: a pread takes no file offset, so the two
    threads share one descriptor (a running doctor holds one, whatever reads it; the probe closes it)."""

    def __init__(self, read: RssReader) -> None:
        self._read = read

    def __call__(self) -> float:
        value = self._read()
        if tracemalloc.is_tracing():
            value -= tracemalloc.get_tracemalloc_memory()
        return value


class Throttled:
    """Base of a probe whose read is expensive (it walks other processes' page tables). On samples it
    reads (`measure()`) at most every `cost / budget` seconds, the cost measured on those reads: the median
    of the last few (a read slowed by a busy machine cannot throttle it for long), leaving out the first
    (one-time costs) and those taken while tracemalloc traces allocations (ten times slower); the first
    read waits until the run has lasted long enough to pay for one of `first_cost` seconds. `read_now`,
    the cleanup ladder's (investigation time, not the probe's budget), reads at once (`measure_now()`,
    which may look closer), but once per step: the ladder reads every metric after each of its rungs,
    which move nothing in other processes.

    It paces itself (`paced`): the doctor asks it on every sample and leaves the pacing to it, so a sample
    on which no read is due costs one clock read. `ready()`, asked only once a read is due and left out of
    its cost, says whether there is anything to read (the workers whose pages the torch integration reads,
    looked for again when new ones appear)."""

    name = "throttled"
    every = 1
    paced = True

    def __init__(self, budget: float, first_cost: float = 0.0) -> None:
        self.budget = budget
        self._costs: deque[float] = deque(maxlen=5)
        self._first = first_cost
        self._reads = 0
        self._next: float | None = None
        self._this_step: Mapping[str, float] | None = None

    @property
    def cost(self) -> float:
        """Seconds one read takes: the median of the last few, or the first while it is the only one
        (sorted in Python: on five numbers numpy's median costs more than the read it paces)."""
        if not self._costs:
            return self._first
        ordered = sorted(self._costs)
        n = len(ordered)
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2

    def ready(self) -> bool:
        """Is there anything to read? Asked only when a read is due; its time is not the read's cost."""
        return True

    def measure(self) -> Mapping[str, float]:
        raise NotImplementedError

    def measure_now(self) -> Mapping[str, float]:
        return self.measure()

    def read(self) -> Mapping[str, float]:
        self._this_step = None  # a sample starts a new step
        now = time.monotonic()
        if self._next is None:
            self._next = now + self._first / self.budget
        if now < self._next or not self.ready():
            return {}
        start = time.monotonic()
        readings = self.measure()
        end = time.monotonic()
        self._reads += 1
        if self._reads == 1:
            self._first = end - start
        elif not tracemalloc.is_tracing():
            self._costs.append(end - start)
        self._next = end + self.cost / self.budget
        return readings

    def read_now(self) -> Mapping[str, float]:
        if self._this_step is None:
            self._this_step = dict(self.measure_now())
        return self._this_step


GROWN, NEW = "workers_grown_bytes", "workers_new_bytes"


@dataclass
class Worker:
    """One child process as the worker probe reads it: its reader (None: psutil's USS), what it held
    alone and its resident anonymous memory when first read and at the last read (None: that read
    failed), and what it came to hold alone during this process's cleanup ladders (`ours`)."""

    reader: PrivateMemory | None
    first: tuple[float, float] | None = None
    now: tuple[float, float] | None = None
    ours: float = 0.0

    @property
    def alone(self) -> float:
        return self.now[0] if self.now else 0.0


class WorkerProbe(Throttled):
    """How much the memory that this process's multiprocessing children (DataLoader workers and the like)
    hold alone grew, each since it was first read, summed over the live ones (`workers_grown_bytes`): a
    worker's growth is judged over its own life, so a worker replaced at each epoch (persistent_workers
    False) starts from naught again instead of dropping a sum. With it, `workers_new_bytes`, the growth of
    their resident anonymous memory: new pages, which only a worker's own allocations make, where what it
    holds alone grows too when this process writes the pages they still share (copy-on-write: the worker
    keeps the old page). On Linux a worker's read costs about 0.25 ms (integrations/_private.py), so within
    its budget it reads a few times a second and sees a worker grow within an epoch of seconds; elsewhere
    psutil's USS walks every page (tens of milliseconds) and reads come every few seconds (without
    `workers_new_bytes`). A worker's reader is opened when it is first seen (its mappings listed: about a
    millisecond, outside the read's cost) and closed when it has gone."""

    name = "workers"
    #: Seconds a read is expected to take before one was measured (a worker read on Linux).
    first_cost = 0.0005
    _specs = {
        GROWN: MetricSpec(GROWN, "bytes", source="process",
                          confirmed_by=(NEW,) if sys.platform.startswith("linux") else ()),
        NEW: MetricSpec(NEW, "bytes", role="supporting", source="process"),
    }
    metrics = tuple(_specs)

    def __init__(self, budget: float = 0.005) -> None:
        super().__init__(budget, self.first_cost)
        self.workers: dict[int, Worker] = {}

    @property
    def alone(self) -> list[float]:
        """What each live worker held alone at the last read (its USS, or an estimate of it)."""
        return [w.alone for w in self.workers.values() if w.first is not None]

    def ready(self) -> bool:
        """Children to read (most runs have none): readers for new ones, those of the gone closed."""
        pids = {child.pid for child in multiprocessing.active_children() if child.pid is not None}
        for pid in set(self.workers) - pids:
            reader = self.workers.pop(pid).reader
            if reader is not None:
                reader.close()
        for pid in pids - set(self.workers):
            self.workers[pid] = Worker(PrivateMemory.of(pid) if sys.platform.startswith("linux") else None)
        return bool(pids)

    def measure(self) -> Mapping[str, float]:
        self._read_workers()
        return self._totals()

    def _read_workers(self) -> None:
        for pid, worker in self.workers.items():
            worker.now = worker.reader.read() if worker.reader is not None else _uss(pid)
            worker.first = worker.first or worker.now

    def _totals(self) -> Mapping[str, float]:
        read = [w for w in self.workers.values() if w.now is not None and w.first is not None]
        if not read:
            return {}
        grown = sum(w.now[0] - w.first[0] - w.ours for w in read)  # type: ignore[index]
        if any(w.reader is None for w in read):
            return {GROWN: grown}
        return {GROWN: grown, NEW: sum(w.now[1] - w.first[1] for w in read)}  # type: ignore[index]

    def read_now(self) -> Mapping[str, float]:
        """The cleanup ladder's read, after every rung where every worker is read exactly (a fraction of a
        millisecond each): what a worker came to hold alone between two reads of one ladder is this
        process's doing, its gc.collect() writing the header of every object they share (copy-on-write
        hands the worker the old page), and is left out of the workers' growth from then on; an
        investigation would otherwise raise the next suspicion of the workers (80 MiB at once, seen on
        the textbook MNIST script). With psutil's USS, once per step."""
        if self._this_step is None or any(w.reader is None for w in self.workers.values()):
            return super().read_now()
        before = {pid: worker.alone for pid, worker in self.workers.items()}
        self._read_workers()
        for pid, worker in self.workers.items():
            worker.ours += max(0.0, worker.alone - before.get(pid, worker.alone))
        self._this_step = dict(self._totals())
        return self._this_step

    def close(self) -> None:
        """Close the workers' readers (the doctor's finish): a later read opens them again, from naught."""
        for worker in self.workers.values():
            if worker.reader is not None:
                worker.reader.close()
        self.workers = {}

    def spec(self, metric: str) -> MetricSpec:
        return self._specs[metric]


def _uss(pid: int) -> tuple[float, float] | None:
    """psutil's USS of a process (and 0 for its anonymous memory, which it does not give apart)."""
    try:
        return float(psutil.Process(pid).memory_full_info().uss), 0.0
    except (psutil.Error, OSError, ValueError):
        return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(field, ctypes.c_size_t) for field in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_in_use() -> Callable[[], float] | None:
    """glibc's bytes in use by malloc, in its heaps and in chunks it mapped on its own (mallinfo2, glibc
    2.33+); None where libc lacks it. It walks the free lists: a ladder's read, not a sample's."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.argtypes = []
    mallinfo2.restype = _MallInfo2

    def in_use() -> float:
        info = mallinfo2()
        return float(info.uordblks + info.hblkhd)

    return in_use


#: What CPython's _PyObject_DebugMallocStats prints: the arenas its small-object allocator has mapped,
#: and the bytes of the blocks in them that objects use.
_ARENAS = re.compile(rb"(\d+) arenas \* (\d+) bytes/arena")
_IN_USE = re.compile(rb"# bytes in allocated blocks\s*=\s*([\d,]+)")


def python_slack() -> Callable[[], float | None] | None:
    """Bytes that CPython's small-object allocator has mapped and no object uses: its arenas (1 MiB
    each on 3.10+) less their allocated blocks (python_arenas); None where the interpreter or libc lacks
    it. The reader gives None while tracemalloc traces, 0 where Python does not use that allocator. An
    arena is mapped for the next small object and stays while one object lives in it, so a few hundred
    objects that come and go can map a MiB: the ladder leaves that out of the mapped size, by which it
    tells new allocations from pages touched again."""
    arenas = python_arenas()
    if arenas is None:
        return None

    def slack() -> float | None:
        read = arenas()
        return None if read is None else read[0] - read[1]

    return slack


def python_arenas() -> Callable[[], tuple[float, float] | None] | None:
    """The bytes CPython's small-object allocator has mapped (its arenas) and the bytes of the blocks in
    them that objects use, read from `_PyObject_DebugMallocStats` into a temporary file; None where the
    interpreter or libc lacks it. The reader gives None while tracemalloc traces (its hooks stand in front
    of that allocator, which then prints nothing), (0, 0) where Python does not use it (PYTHONMALLOC=malloc).
    A walk of the arenas (about a millisecond): a ladder's or a triage's read, not a sample's."""
    try:
        libc, stats = ctypes.CDLL(None), ctypes.pythonapi._PyObject_DebugMallocStats
        tmpfile, fflush, fileno, fclose = libc.tmpfile, libc.fflush, libc.fileno, libc.fclose
    except (OSError, AttributeError):
        return None
    tmpfile.restype = ctypes.c_void_p
    stats.argtypes = fflush.argtypes = fileno.argtypes = fclose.argtypes = [ctypes.c_void_p]

    def read() -> tuple[float, float] | None:
        if tracemalloc.is_tracing():
            return None
        stream = tmpfile()
        if not stream:  # no descriptor or no space for it
            return None
        try:
            stats(stream)
            fflush(stream)
            text = os.pread(fileno(stream), 1 << 20, 0)
        finally:
            fclose(stream)
        arenas, in_use = _ARENAS.search(text), _IN_USE.search(text)
        if arenas is None or in_use is None:
            return 0.0, 0.0
        return float(int(arenas[1]) * int(arenas[2])), float(int(in_use[1].replace(b",", b"")))

    return read


def malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), which returns free heap pages to the OS; None where libc lacks it."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def workers_rule(probe: WorkerProbe) -> Rule:
    """Worker processes whose own memory grows where no framework rule named why. A finding when their new
    anonymous memory grew with it (pages only their own allocations make), or where that cannot be read
    apart (psutil's USS); else a note: all of it was in pages they share with this process, which
    copy-on-write hands to a worker whichever of the two writes them (this process's training writes its
    heap, a worker reads objects there and writes their reference counts), at most all they share."""

    def dataloader_workers(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        if GROWN not in ev.unexplained(accepted) or not ev.survives(GROWN):
            return []
        alone = probe.alone
        sizes = [float(u) for u in alone]
        new = ev.kept(NEW) if ev.end.after(NEW) is not None else None
        if new is not None and new < ACCOUNTED * ev.expected(GROWN):
            ev.note(GROWN, msg("shared_pages", growth=ev.describe(GROWN), new=new, sizes=sizes))
            return []
        return [ev.finding(
            "dataloader_workers", GROWN, explains=(GROWN, NEW),
            evidence=msg("workers_grew", growth=ev.describe(GROWN), workers=len(alone), sizes=sizes,
                         new=msg("new_of_their_own", size=new) if new else None),
            recommendation=msg("workers_keep"),
        )]

    return Rule(40, dataloader_workers)


#: The share of the doctor's budget the workers' reads may take, on a schedule of their own (a probe that
#: paces itself: its time is left out of the sampling pacer's, _reading/probing.py), and only while the run
#: has workers: all of it, as the torch probe of the pages workers copy has. On Linux a worker's read costs
#: 0.25 ms (0.7 ms on a busy machine), so one worker is read every 0.05 to 0.15 s, about 25 steps of the
#: textbook MNIST script: a worker replaced at each epoch of 400 steps shows its growth in a dozen reads
#: (at half the budget, a run in six missed it in both epochs under load). Elsewhere (psutil's USS, tens
#: of ms) it reads every few seconds.
WORKERS_SHARE = 1.0


def figure_probe(limit: limits.Limit) -> list[Any]:
    """The probe of the figure `limit` is compared with, where that is not resident memory."""
    if limit.figure == limits.CHARGE and limit.charge:
        return [CgroupProbe(limit.charge, limit.bytes)]
    if limit.figure == limits.ADDRESS:
        return [AddressSpaceProbe(limit.bytes)]
    return []


def integration(limit: float | limits.Limit | None = None, budget: float = 0.005) -> Integration:
    """Process probes for any run. `limit` is the process limit (a number: resident memory's), by default
    the one detected; a cgroup's or RLIMIT_AS adds the probe of the figure it is compared with; `budget` is the
    doctor's overhead budget, of which the worker probe may take WORKERS_SHARE."""
    found = limit if isinstance(limit, limits.Limit) else limits.Limit(float(limit), "user") if limit else \
        limits.process_limit()
    workers = WorkerProbe(budget * WORKERS_SHARE)
    trim = malloc_trim()
    return Integration(
        name="process",
        probes=[RssProbe(found.bytes), *figure_probe(found), workers],
        cleanups=[Cleanup("malloc_trim", trim, settle=True)] if trim else [],
        rules=[workers_rule(workers)],
    )
