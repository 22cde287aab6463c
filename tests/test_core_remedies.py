"""The framework-free remedies' rules of engagement: which findings they take, and that they act
within their time budget. (gc_collect's effect on a real leak is in test_core_leaks.)"""

from __future__ import annotations

import gc

from leakdoctor.integrations import process
from leakdoctor.remedies import load, resolve
from leakdoctor.remedies.base import Periodic, RemedyContext
from leakdoctor.summary import Finding


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
    if remedy.applicable(take):
        assert "malloc_trim" in remedy.apply(take)
        for step in range(5):
            remedy.on_step(RemedyContext(take.finding, {}, step=step, step_seconds=0.01))


def test_periodic_work_stays_within_its_budget():
    calls = []
    periodic = Periodic(lambda: (calls.append(1), gc.collect()), budget=0.01)
    ran = sum(periodic.tick(step_seconds=1e-4) for _ in range(2000))  # steps of 0.1 ms, gc costs more
    assert ran == len(calls) and 1 <= ran < 2000
    assert periodic.every > 1
