"""The framework-free remedies' rules of engagement: which findings they take, and that they act
within their time budget. (gc_collect's effect on a real leak is in test_core_leaks.)"""

from __future__ import annotations

import time

import psutil
import pytest

from leakdoctor.integrations import _process as process
from leakdoctor.remedies import load, resolve
from leakdoctor.remedies._base import Periodic, RemedyContext
from leakdoctor.reporting.summary import Finding


def finding(cause: str, reclaimed_by: str | None, metric: str = "rss_bytes") -> Finding:
    return Finding(cause, metric, 1, 2, 1e5, "bytes", None, "", "", reclaimed_by=reclaimed_by)


def test_levels_resolve_in_registry_order():
    assert resolve("off") == ()
    assert resolve("safe") == ("force_eval", "cap_cache", "clear_cache", "gc_collect", "malloc_trim")
    assert resolve("all")[-4:] == ("remove_hooks", "detach_retained", "cond_to_where", "clear_session")


def test_gc_collect_takes_only_growth_that_gc_took_back():
    remedy = load("gc_collect")()
    assert remedy.applicable(RemedyContext(finding("python_objects", "gc_collect"), {}))
    assert not remedy.applicable(RemedyContext(finding("python_objects", None), {}))
    assert not remedy.applicable(RemedyContext(finding("native_memory", "gc_collect"), {}))


def test_malloc_trim_takes_the_c_heap_cache_of_resident_memory():
    remedy = load("malloc_trim")()
    take = RemedyContext(finding("allocator_cache", "malloc_trim"), {})
    assert remedy.applicable(take) == (process.malloc_trim() is not None)  # glibc only
    assert not remedy.applicable(RemedyContext(finding("allocator_cache", "clear_cache"), {}))
    assert not remedy.applicable(RemedyContext(finding("allocator_cache", "malloc_trim", "mlx_cache_bytes"), {}))


def test_malloc_trim_returns_the_freed_c_heap_on_its_first_step():
    """100 MiB of small blocks freed under one still in use: glibc keeps the pages (the heap's top is
    in use, so free() cannot shrink it) until malloc_trim hands them back, on the remedy's first step."""
    remedy = load("malloc_trim")()
    take = RemedyContext(finding("allocator_cache", "malloc_trim"), {}, step=1, step_seconds=0.01)
    if not remedy.applicable(take):
        pytest.skip("this libc has no malloc_trim")
    chunks = [bytearray(1024) for _ in range(100 * 1024)]  # over pymalloc's 512 bytes: the C heap's
    pin = chunks[-1]  # the last block, at the heap's top (earlier holes were filled first)
    del chunks
    before = psutil.Process().memory_info().rss
    remedy.on_step(take)
    assert before - psutil.Process().memory_info().rss > 50 * 2**20
    del pin


def test_periodic_work_backs_off_by_doubling_to_its_budget():
    """An action dearer than its budget (2 ms against 1% of 0.1 ms steps) runs on steps 1, 2, 4, ...:
    its interval doubles after each run up to the longest, 1000 steps, so 2000 steps run it 11 times."""
    ran = []
    periodic = Periodic(lambda: time.sleep(0.002), budget=0.01)
    for step in range(1, 2001):
        if periodic.tick(step_seconds=1e-4):
            ran.append(step)
    assert ran == [2**k for k in range(11)] and periodic.every == 1000


