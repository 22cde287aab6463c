"""How much memory a child process (a DataLoader worker) holds alone, in a fraction of a millisecond.

Its USS, as /proc/PID/smaps_rollup counts it, walks every page the child maps, its shared libraries
included: 4 to 15 ms for a worker forked from a process that imported torch, too dear to read more than
every few seconds within the doctor's budget, while a worker's growth can last an epoch of seconds. Most
of what a forked worker holds alone is anonymous memory, which two cheap reads give: its resident
anonymous pages (/proc/PID/statm: resident less file-backed and shared memory, counters the kernel
keeps) less those it still shares. A forked child starts with all its parent's resident heap, shared;
writing objects there (a reference count, a sample stored in memory the parent had freed but kept)
copies pages into the child without a new resident page. So the shared part is read from
/proc/PID/pagemap (anonymous, present, and mapped by another process too: bit 56 clear, Linux 4.2+) over
the writable anonymous mappings the child had when first seen, from a fixed sample of runs spread over
them (SAMPLE_PAGES pages, each range weighed by its size): a page once copied stays the child's, so the
estimate moves with the copies, never by chance; the libraries' data it shares is read whole, once.
Anonymous memory mapped later (a grown heap, new arenas) is the child's alone, counted by statm exactly.
Which process wrote a page cannot be told (page frame numbers need CAP_SYS_ADMIN): when the parent
writes a page they share, the child keeps the old one alone, as its USS says too; the new resident
anonymous memory, which `read` gives apart, only the child's own allocations make.

Linux only: `PrivateMemory.of` returns None elsewhere, or where the child's files cannot be read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from leakdoctor.integrations._pages import PAGE

#: Pages of pagemap read per sample, at most: about 0.1 ms of the kernel's page walk.
SAMPLE_PAGES = 4096
#: Pages per run of the sample (one pread each): a cluster of copies a run wide is never missed, and fewer,
#: longer runs cost fewer system calls (32: 150 reads of 4096 pages in 0.23 ms; 8: 530 in 0.55 ms).
RUN_PAGES = 32
_PRESENT, _EXCLUSIVE, _FILE = np.uint64(1 << 63), np.uint64(1 << 56), np.uint64(1 << 61)
_FLAGS = _PRESENT | _EXCLUSIVE | _FILE


def mappings(maps: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(first page, pages) of the private mappings in a /proc/PID/maps text that hold anonymous memory:
    the writable anonymous ones (the heap, malloc's and Python's arenas, large allocations), which grow
    and are sampled; and the libraries' data (their relocated and written pages, copied at load: a few
    MiB, read once)."""
    grows, data = [], []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[1][3:4] != b"p" or fields[1][:1] != b"r" or fields[1][2:3] == b"x":
            continue
        name = fields[5].strip() if len(fields) == 6 else b""
        low, high = (int(x, 16) for x in fields[0].split(b"-"))
        pages = (low // PAGE, (high - low) // PAGE)
        if fields[1][1:2] == b"w" and name in (b"", b"[heap]"):
            grows.append(pages)
        elif name.startswith(b"/"):
            data.append(pages)
    return grows, data


def sample_runs(ranges: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Runs of RUN_PAGES pages spread evenly over the ranges, SAMPLE_PAGES pages in all at most (every
    page where the ranges hold fewer), and the pages each page read stands for: its range's pages over
    those read in it (a small range is read whole, a large one one run in many, and the estimate weighs
    each range by its size: a thread's stack or a malloc arena's reserve, mostly absent, would otherwise
    count as much as the heap)."""
    total = sum(n for _, n in ranges)
    stride = max(RUN_PAGES, -(-total * RUN_PAGES // SAMPLE_PAGES))
    runs, weights = [], []
    for first, n in ranges:
        mine = [(first + at, min(RUN_PAGES, n - at)) for at in range(0, n, stride)] if n else []
        read = sum(count for _, count in mine)
        runs += mine
        weights.append(np.full(read, n / read) if read else np.empty(0))
    return runs, np.concatenate(weights) if weights else np.empty(0)


def shared_anonymous(pagemap: int, runs: list[tuple[int, int]]) -> np.ndarray | None:
    """For each page of the runs of a pagemap: is it anonymous, present and mapped by another process too?
    None where it cannot be read."""
    raw = b"".join(os.pread(pagemap, 8 * n, 8 * first) for first, n in runs)
    if len(raw) < 8 * sum(n for _, n in runs):
        return None
    return (np.frombuffer(raw, dtype=np.uint64) & _FLAGS) == _PRESENT


@dataclass
class PrivateMemory:
    """One child's anonymous memory that it holds alone, in bytes (`read`), from its statm and a sample
    of its pagemap, both opened once (`close` lets them go). The libraries' data it shares (`fixed`) is
    read once, when it is first seen."""

    pid: int
    statm: int
    pagemap: int
    runs: list[tuple[int, int]]
    weights: np.ndarray  # the pages each page read stands for
    fixed: int  # pages of the libraries' data still shared when first seen

    @classmethod
    def of(cls, pid: int) -> "PrivateMemory | None":
        """The reader of process `pid`'s memory; None where its files cannot be read (not Linux, gone,
        access denied)."""
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                grows, data = mappings(f.read())
        except OSError:
            return None
        fds: list[int] = []
        try:
            for name in ("statm", "pagemap"):
                fds.append(os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC))
            fixed = shared_anonymous(fds[1], data)
        except OSError:
            fixed = None
        if fixed is None:
            for fd in fds:
                os.close(fd)
            return None
        return cls(pid, fds[0], fds[1], *sample_runs(grows), int(np.count_nonzero(fixed)))

    def read(self) -> tuple[float, float] | None:
        """(bytes of anonymous memory the process holds alone, bytes of anonymous memory resident); None
        once it cannot be read (it exited)."""
        try:
            fields = os.pread(self.statm, 128, 0).split()
            shared = shared_anonymous(self.pagemap, self.runs)
        except OSError:
            return None
        if len(fields) < 3 or shared is None:
            return None
        anonymous = int(fields[1]) - int(fields[2])
        estimate = float(self.weights @ shared)
        return max(0.0, anonymous - self.fixed - estimate) * PAGE, float(anonymous * PAGE)

    def close(self) -> None:
        for fd in (self.statm, self.pagemap):
            try:
                os.close(fd)
            except OSError:
                pass
        self.statm = self.pagemap = -1
