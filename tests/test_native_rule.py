"""The native_memory fallback on evidence built by hand from the ladders of a real run: resident memory
that grew back into the pages the first ladder's malloc_trim returned, with malloc's bytes in use and the
mapped size level (a correct Lightning fit that validates every 40 steps, ladders read at steps 171, 175
and 179), is a note; the same growth with malloc's bytes in use growing, or above where the window began,
is a leak. (A real C leak growing below where the window began: test_core_leaks.)"""

from __future__ import annotations

from helpers import says

from leakdoctor.detect import Trend
from leakdoctor.diagnosis import HEAP, MAPPED, Evidence, Ladder, fallback
from leakdoctor.integrations import MetricSpec

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
    trend = Trend("growing", slope=23 * 1024)
    return Evidence(
        start_step=171, end_step=179, suspects={RSS: trend}, trends={RSS: trend},
        specs={RSS: MetricSpec(RSS, "bytes", source="process")},
        begin=ladder(171, 469.31, after[0], heaps[0], mapped[0]),
        middle=ladder(175, 450.35, after[1], heaps[1], mapped[1]),
        end=ladder(179, 458.83, after[2], heaps[2], mapped[2]), reports={})


def test_resident_memory_refilling_trimmed_pages_with_nothing_allocated_is_a_note():
    ev = evidence(after=(439.30, 439.69, 440.05), heap=(167.327, 167.731, 167.627))
    assert ev.survives(RSS) and fallback(ev, []) == []
    assert says(ev.notes[RSS], "malloc_trim_returned", "not_a_leak"), ev.notes


def test_the_same_growth_with_malloc_allocating_it_is_native_memory():
    ev = evidence(after=(439.30, 439.69, 440.05), heap=(167.327, 167.70, 168.08))
    (found,) = fallback(ev, [])
    assert (found.cause, found.metric) == ("native_memory", RSS) and not ev.notes


def test_the_same_growth_in_newly_mapped_memory_is_native_memory():
    ev = evidence(after=(439.30, 439.69, 440.05), heap=(167.327, 167.731, 167.627),
                  mapped=(983.36, 983.80, 984.20))
    assert [f.cause for f in fallback(ev, [])] == ["native_memory"]


def test_growth_above_where_the_window_began_is_native_memory_whatever_malloc_says():
    ev = evidence(after=(439.30, 455.0, 470.0), heap=(167.327, 167.731, 167.627))
    assert [f.cause for f in fallback(ev, [])] == ["native_memory"]


def test_without_malloc_to_ask_the_growth_stays_a_finding():
    ev = evidence(after=(439.30, 439.69, 440.05), heap=None)
    assert [f.cause for f in fallback(ev, [])] == ["native_memory"]
