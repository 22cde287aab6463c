"""The native_memory fallback on evidence built by hand from the ladders of a real run: resident memory
that grew back into the pages the first ladder's malloc_trim returned, with malloc's bytes in use and the
mapped size level (a correct Lightning fit that validates every 40 steps, ladders read at steps 171, 175
and 179), is a note, and so is the same growth above where the window began; the same growth with
malloc's bytes in use growing, or in newly mapped memory, is a leak. Then real ladders around glibc's
behaviour: a worker thread's freed temporary stays resident, which malloc_trim cannot return. (A real C
leak growing below where the window began: test_core_leaks.)"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest
from helpers import isolated, says

from leakdoctor.integrations import Cleanup, MetricSpec
from leakdoctor.integrations._process import RssProbe, malloc_in_use, malloc_trim, python_slack
from leakdoctor._base.trend import Trend
from leakdoctor._judging.diagnosis import fallback
from leakdoctor._base.evidence import HEAP, MAPPED, Evidence, Ladder
from leakdoctor._judging.investigate import run_ladder
from leakdoctor._base.guard import Guard

MIB = 2**20
RSS = "rss_bytes"


def ladder(step: int, before: float, after: float, heap: float | None, mapped: float) -> Ladder:
    """A ladder's first and last readings (in MiB): resident memory before and after malloc_trim."""
    backing = {MAPPED: mapped * MIB, **({HEAP: heap * MIB} if heap is not None else {})}
    return Ladder([("before", {RSS: before * MIB, **backing}), ("malloc_trim", {RSS: after * MIB, **backing})],
                  frozenset({"malloc_trim"}), step)


def evidence(after: tuple[float, float, float], heap: tuple[float, float, float] | None,
             mapped: tuple[float, float, float] = (983.36, 983.36, 983.36)) -> Evidence:
    """Suspected at 23 KiB a step (the fit's validation staircase); resident memory read at 469.3 MiB
    before the first ladder, then `after` each ladder."""
    heaps = heap or (None, None, None)
    trend = Trend("growing", slope=23 * 1024, slope_low=16 * 1024, slope_high=30 * 1024)  # a fit's interval
    return Evidence(
        start_step=171, end_step=179, suspects={RSS: trend}, trends={RSS: trend},
        specs={RSS: MetricSpec(RSS, "bytes", source="process")},
        begin=ladder(171, 469.31, after[0], heaps[0], mapped[0]),
        middle=ladder(175, 450.35, after[1], heaps[1], mapped[1]),
        end=ladder(179, 458.83, after[2], heaps[2], mapped[2]), reports={})


def test_resident_memory_refilling_trimmed_pages_with_nothing_allocated_is_a_note():
    ev = evidence(after=(439.30, 439.69, 440.05), heap=(167.327, 167.731, 167.627))
    assert ev.survives(RSS) and fallback(ev, []) == []
    assert says(ev.notes[RSS], "nothing_allocated", "not_a_leak"), ev.notes


def test_the_same_growth_with_malloc_allocating_it_is_native_memory():
    ev = evidence(after=(439.30, 439.69, 440.05), heap=(167.327, 167.70, 168.08))
    (found,) = fallback(ev, [])
    assert (found.cause, found.metric) == ("native_memory", RSS) and not ev.notes


def test_the_same_growth_in_newly_mapped_memory_is_native_memory():
    ev = evidence(after=(439.30, 439.69, 440.05), heap=(167.327, 167.731, 167.627),
                  mapped=(983.36, 983.80, 984.20))
    assert [f.cause for f in fallback(ev, [])] == ["native_memory"]


def test_growth_above_where_the_window_began_with_nothing_allocated_or_mapped_is_a_note():
    """Resident memory can grow past where the window began with nothing new allocated: the free top of
    a worker thread's malloc heap, which malloc_trim does not return (below, for real)."""
    ev = evidence(after=(439.30, 455.0, 470.0), heap=(167.327, 167.731, 167.627))
    assert ev.survives(RSS) and fallback(ev, []) == []
    assert says(ev.notes[RSS], "not_a_leak"), ev.notes


def test_the_same_growth_above_where_the_window_began_with_malloc_allocating_it_is_native_memory():
    ev = evidence(after=(439.30, 455.0, 470.0), heap=(167.327, 183.0, 198.0))
    assert [f.cause for f in fallback(ev, [])] == ["native_memory"]


def _in_the_worker(worker: ThreadPoolExecutor, size: int, keep: list[int] | None = None) -> None:
    """malloc `size` bytes on the worker thread (its own malloc heap) and touch them; free them unless kept.
    One long-lived worker, as XLA's thread pool is: a new thread for each call would race the last one's
    exit for its arena (Python's join returns before glibc hands the arena back), and a second arena's
    64 MiB reservation would show as newly mapped memory."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def work() -> None:
        chunk = libc.malloc(size)
        ctypes.memset(chunk, 1, size)
        if keep is None:
            libc.free(chunk)
        else:
            keep.append(chunk)

    worker.submit(work).result()


def judge_window(kept: bool) -> tuple[bool, list[str], dict[str, str]]:
    """In a fresh process: real ladders (resident memory, malloc's bytes in use and the mapped size, each
    read after a real malloc_trim) at a window's start, middle and end, with an evaluation on a worker
    thread in each half: a temporary of 20 MiB, then 24 MiB, freed (or `kept`). A 30 MiB one first lifts
    malloc's mmap threshold (up to its cap, 32 MiB), so the next ones come from the thread's heap, as they
    do in a long run.
    Returns whether resident memory survived the ladders, the fallback's causes and the notes."""
    held: list[int] = []
    worker = ThreadPoolExecutor(max_workers=1)
    _in_the_worker(worker, 30 * MIB)
    try:
        return judge_real_ladders(lambda step: _in_the_worker(worker, (16 + step) * MIB, held if kept else None))
    finally:
        worker.shutdown()


def judge_real_ladders(work: Callable[[int], object]) -> tuple[bool, list[str], dict[str, str]]:
    """Real ladders (resident memory, malloc's bytes in use and the mapped size, each read after a real
    malloc_trim) at steps 0, 4 and 8, `work(step)` done before the last two; the window judged as growing
    by a quarter MiB a step. Whether resident memory survived the ladders, the fallback's causes and the
    notes."""
    probe, trim = RssProbe(limit=None), malloc_trim()
    assert trim is not None
    cleanups = [Cleanup("malloc_trim", trim, settle=True)]
    ladders = []
    for step in (0, 4, 8):
        if step:
            work(step)
        ladders.append(run_ladder(cleanups, probe.read_now, Guard(), step))
    probe.close()
    trend = Trend("growing", slope=MIB / 4, slope_low=MIB / 8, slope_high=MIB / 2)
    ev = Evidence(start_step=0, end_step=8, suspects={RSS: trend}, trends={RSS: trend},
                  specs={RSS: MetricSpec(RSS, "bytes", source="process")}, begin=ladders[0], middle=ladders[1],
                  end=ladders[2], reports={})
    return ev.survives(RSS), [f.cause for f in fallback(ev, [])], ev.notes


needs_glibc = pytest.mark.skipif(malloc_in_use() is None or malloc_trim() is None,
                                 reason="needs glibc's mallinfo2 and malloc_trim")


@needs_glibc
def test_a_worker_threads_freed_temporary_that_stays_resident_is_a_note_not_native_memory():
    """An evaluation in a worker thread (XLA's thread pool at an epoch's end) frees its temporary at the
    top of that thread's heap: it stays resident after malloc_trim, with nothing allocated or mapped."""
    survived, causes, notes = isolated(judge_window, kept=False)
    assert survived and causes == [], (causes, notes)
    assert says(notes[RSS], "not_a_leak", "nothing_allocated"), notes


@needs_glibc
def test_the_same_memory_kept_by_the_worker_thread_is_native_memory():
    survived, causes, notes = isolated(judge_window, kept=True)
    assert survived and causes == ["native_memory"], (causes, notes)


def judge_python_window(keep_every: int) -> tuple[bool, list[str], dict[str, str]]:
    """In a fresh process: real ladders at a window's start, middle and end, with 200,000 small Python
    objects made in the first half and 400,000 in the second (past the slots the first half left free),
    of which every `keep_every`-th is kept: one in two hundred leaves Python's arenas mapped around a few
    objects (fragmentation, tens of MiB), every one keeps them all in use. (One in a hundred kept 0.49 MiB
    of objects in the second half, against the half MiB that tells a new allocation: a coin toss.)
    Returns whether resident memory survived the ladders, the fallback's causes and the notes."""
    held: list[object] = []

    def make(step: int) -> None:
        made = [(i, float(i)) for i in range(50_000 * step)]
        held.extend(made[::keep_every])

    return judge_real_ladders(make)


needs_python_slack = pytest.mark.skipif(python_slack() is None or python_slack()() is None,
                                        reason="needs CPython's small-object allocator statistics")


@needs_glibc
@needs_python_slack
def test_python_arenas_left_mapped_around_a_few_objects_are_not_newly_allocated_memory():
    """Arenas that Python keeps mapped for the few objects still in them are no native allocation: the
    fallback notes the resident growth instead of calling it native_memory."""
    survived, causes, notes = isolated(judge_python_window, keep_every=200)
    assert survived and causes == [], (causes, notes)
    assert says(notes[RSS], "not_a_leak", "nothing_allocated"), notes


@needs_glibc
@needs_python_slack
def test_the_same_objects_all_kept_are_newly_allocated_memory():
    survived, causes, notes = isolated(judge_python_window, keep_every=1)
    assert survived and causes == ["native_memory"], (causes, notes)


def test_growth_that_nothing_proves_whose_rate_may_be_too_slow_to_matter_is_a_note():
    """The same malloc-backed growth, suspected at 23 KiB a step on a short window whose interval reaches
    down to 200 bytes a step (the tail of a clean run's warm-up): nothing proves a leak and the low end of
    the rate does not matter over the horizon, so it is watched on, not reported."""
    ev = evidence(after=(439.30, 439.69, 440.05), heap=(167.327, 167.70, 168.08))
    ev.suspects[RSS] = ev.trends[RSS] = Trend("growing", slope=23 * 1024, slope_low=200, slope_high=46 * 1024)
    assert ev.survives(RSS) and fallback(ev, []) == []
    assert says(ev.notes[RSS], "slow_unproven_note"), ev.notes
