"""Forensics on their own, with real processes: the pagemap count of a Python list's pages that a forked
child copied by reading it (the DataLoader workers' copy-on-read, pytorch#13246), the throttle of the
probes whose reads are expensive, which the doctor's probe schedule leaves to them, and where the user's
code grows: the line that appends to a watched list (its new items' allocation tracebacks) and the
user's call that makes jax trace and compile again."""

from __future__ import annotations

import multiprocessing
import sys
import time
from typing import Any, Mapping

import pytest

from leakdoctor.integrations._pages import PAGE, ItemPages
from leakdoctor.integrations._private import PrivateMemory
from leakdoctor.integrations._process import Throttled
from leakdoctor._base.guard import Guard
from leakdoctor._reading.probing import Probes

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/pagemap is Linux's")


def read_every(records: list, step: int, ready: Any, done: Any) -> None:
    """A forked child that reads every `step`-th record (and so writes its reference count), then waits."""
    total = sum(len(records[i]) for i in range(0, len(records), step)) if step else 0
    ready.put(total)
    done.wait(60)


def copied_by_child(records: list, step: int) -> tuple[float, float, float]:
    """(exact, sampled, all) bytes of the records' pages a child reading every `step`-th record copied."""
    pages = ItemPages.of(records)
    assert pages is not None
    context = multiprocessing.get_context("fork")
    ready, done = context.Queue(), context.Event()
    child = context.Process(target=read_every, args=(records, step, ready, done))
    child.start()
    try:
        ready.get(timeout=60)
        exact, sampled = pages.copied_bytes(child.pid, exact=True), pages.copied_bytes(child.pid)
    finally:
        done.set()
        child.join(10)
    assert exact is not None and sampled is not None
    return exact, sampled, pages.nbytes


@linux
def test_pagemap_counts_the_pages_a_forked_child_copied_by_reading():
    records = [bytes(4000) for _ in range(20_000)]  # about a page each
    exact, sampled, total = copied_by_child(records, 5)  # a fifth of them read
    assert 0.15 * total < exact < 0.3 * total
    assert 0.5 * exact < sampled < 1.5 * exact  # the probe's sample estimates the same
    untouched, _, _ = copied_by_child(records, 0)  # a child that reads none of them
    assert untouched < 0.01 * total


@linux
def test_item_pages_of_lists_and_tuples_only():
    # the pages that hold the items' headers (where a read writes the reference count): items over a page
    # long never share one; items under a page long may (100 items of 4000 B once gave 97 pages)
    assert ItemPages.of(tuple(bytes(2 * PAGE) for _ in range(100))).nbytes == 100 * PAGE
    assert ItemPages.of([1.5] * 10).nbytes > 0  # one float, one page
    assert ItemPages.of({i: i for i in range(100)}) is None and ItemPages.of([]) is None


def write_or_keep(shared: bytearray, size: int, keep: bool, ready: Any, done: Any) -> None:
    """A forked child that writes into `size` bytes of the pages it shares with its parent (`shared`, its
    copy of the parent's buffer), or keeps `size` bytes of new memory; then waits."""
    kept = bytearray(b"x") * size if keep else None
    if not keep:
        for i in range(0, size, PAGE):
            shared[i] = 1
    ready.put(kept is not None)
    done.wait(60)


def grown_in_child(size: int, keep: bool) -> tuple[float, float]:
    """(what the child holds alone grew, its resident anonymous memory grew), in bytes, read by the
    worker reader from before the child writes to after."""
    shared = bytearray(b"s") * size  # resident in the parent, shared with the child at the fork
    context = multiprocessing.get_context("fork")
    go, ready, done = context.Event(), context.Queue(), context.Event()
    child = context.Process(target=lambda: (go.wait(60), write_or_keep(shared, size, keep, ready, done)))
    child.start()
    try:
        reader = PrivateMemory.of(child.pid)
        assert reader is not None
        before = reader.read()
        go.set()
        ready.get(timeout=60)
        after = reader.read()
        reader.close()
    finally:
        done.set()
        child.join(10)
    assert before is not None and after is not None
    return after[0] - before[0], after[1] - before[1]


@linux
def test_the_worker_reader_sees_a_forked_child_copy_shared_pages_and_allocate_new_ones():
    """Copy-on-write of pages shared with the parent grows what the child holds alone without a new
    resident page; new memory grows both."""
    size = 32 * 2**20
    copied, new = grown_in_child(size, keep=False)
    assert 0.7 * size < copied < 1.3 * size and new < 0.1 * size
    kept, new = grown_in_child(size, keep=True)
    assert 0.7 * size < kept < 1.3 * size and 0.7 * size < new < 1.3 * size


class Counting(Throttled):
    name = "counting"

    def __init__(self, budget: float, first_cost: float) -> None:
        super().__init__(budget, first_cost)
        self.measured = 0

    def measure(self) -> Mapping[str, float]:
        self.measured += 1
        return {"m": float(self.measured)}

    def spec(self, metric: str) -> Any:
        return None


def test_throttled_probe_waits_to_afford_its_first_read_and_the_ladder_reads_once_a_step():
    patient = Counting(budget=0.005, first_cost=10.0)  # a read of 10 s: not before 2000 s of run
    assert patient.read() == {} and patient.measured == 0
    assert patient.read_now() == {"m": 1.0}  # the ladder reads at once...
    assert patient.read_now() == {"m": 1.0} and patient.measured == 1  # ...once in the step, for every rung
    assert patient.read() == {}  # a new step: still throttled
    assert patient.read_now() == {"m": 2.0}
    eager = Counting(budget=0.005, first_cost=0.0)
    assert eager.read() == {"m": 1.0}


def spin(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


class Waiting(Counting):
    """A throttled probe whose reads take 1 ms and that has something to read only once `ready` is set."""

    def __init__(self) -> None:
        super().__init__(budget=0.005, first_cost=0.0)
        self.workers = False
        self.asked = 0

    def ready(self) -> bool:
        self.asked += 1
        return self.workers

    def measure(self) -> Mapping[str, float]:
        spin(0.001)
        return super().measure()


def test_throttled_probe_asks_whether_it_has_anything_to_read_only_when_a_read_is_due():
    probe = Waiting()
    assert probe.read() == {} and probe.asked == 1  # due at once, nothing to read yet
    probe.workers = True
    assert probe.read() == {"m": 1.0} and probe.asked == 2
    assert probe.read() == {} and probe.asked == 2  # the next is due in 0.2 s: the clock says so alone


class Dear:
    """A probe whose reads cost 200 µs of this thread's time (ten times a counter's allowance): every
    read, or only the `only`-th."""

    name = "dear"
    every = 1

    def __init__(self, paced: bool, only: int | None = None) -> None:
        self.paced = paced
        self.only = only
        self.reads = 0

    def read(self) -> Mapping[str, float]:
        self.reads += 1
        if self.only in (None, self.reads):
            spin(200e-6)
        return {}

    def spec(self, metric: str) -> Any:
        return None


def test_a_probe_that_paces_itself_is_asked_on_every_sample_however_dear_its_reads():
    """A dear probe is read more rarely by its measured cost, unless it paces itself (as a throttled
    probe does, within a budget of its own): thinned twice, its series would get too few windows."""
    paced, plain = Dear(paced=True), Dear(paced=False)
    probes = Probes([paced, plain], {}, Guard())
    for _ in range(64):
        probes.read_due()
    assert paced.reads == 64
    assert plain.reads < 32


def test_one_slow_read_does_not_thin_a_cheap_probe():
    """A counter whose 16th read (the first timed) was slowed, by a garbage collection say, is still read
    on every sample: its windows close with the other series', so they are investigated together."""
    counter = Dear(paced=False, only=16)
    probes = Probes([counter], {}, Guard())
    for _ in range(64):
        probes.read_due()
    assert counter.reads == 64


class Floor(Dear):
    """A probe whose every read costs 200 µs, like a counter read after a step that evicted the caches,
    which the sample exists for."""

    essential = True


def test_an_essential_probe_is_read_on_every_sample_however_dear_and_its_cost_is_paced():
    probe = Floor(paced=False)
    probes = Probes([probe], {}, Guard())
    for _ in range(64):
        probes.read_due()
    assert probe.reads == 64
    assert probes.paced_seconds == 0.0  # its reads are the sample's cost: the doctor's pacer counts them


class Record:
    def __init__(self) -> None:
        self.values: list[float] = []


def test_the_type_census_counts_the_users_objects_and_not_leakdoctors_own():
    from leakdoctor.integrations._python import TypeCensus
    from leakdoctor._base.trend import Trend

    census = TypeCensus()
    census.begin()
    kept = [Record() for _ in range(20)] + [Trend("flat") for _ in range(20)]
    rows = dict(census.end(steps=10).rows)
    assert rows.get(f"{Record.__module__}.Record", 0) >= 20 and len(kept) == 40
    assert not [name for name in rows if name.startswith("leakdoctor.")], rows


# --- where the user's code grows: the line that stores into a container, the call that compiles -------

class Keeper:
    def __init__(self) -> None:
        self.kept: list = []

    def keep(self) -> None:
        self.kept.append(bytearray(1000))  # KEEPER-APPEND

    def reset(self) -> None:
        self.kept.insert(0, bytearray(1))  # never called while the window is open


def _line(marker: str) -> int:
    from pathlib import Path

    text = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(text, 1) if line.rstrip().endswith(f"# {marker}"))


def made() -> bytearray:
    return bytearray(1000)


def _sites_of_a_window(fill) -> str | None:
    """container_location of Keeper.kept after a traced window in which `fill(keeper)` ran 5 times."""
    import tracemalloc

    from leakdoctor.integrations._python import AllocationDiff, ContainerSites, Watchlist, container_location
    from leakdoctor._base.guard import Guard

    keeper, watchlist = Keeper(), Watchlist(Guard())
    watchlist.add_object(keeper, "keeper", include_private=False)
    watchlist.read()  # registers len(keeper.kept)
    tracing, sites = AllocationDiff(), ContainerSites(watchlist)
    tracing.begin()
    sites.begin()
    try:
        for _ in range(5):
            fill(keeper)
        origins = sites.end(5)
    finally:
        tracing.end(5)
    assert not tracemalloc.is_tracing()
    assert len(origins.stacks["len(keeper.kept)"]) == 5
    return container_location(watchlist, "len(keeper.kept)", origins)


def test_a_watched_list_is_placed_at_the_line_that_appends_in_its_method():
    location = _sites_of_a_window(Keeper.keep)
    assert location == f"Keeper.kept (tests/test_forensics.py:{_line('KEEPER-APPEND')})"


def fill_from_outside(keeper: Keeper) -> None:
    record = made()
    keeper.kept.append(record)  # OUTSIDE-APPEND


def test_a_list_filled_from_outside_its_class_is_placed_at_that_append_not_at_the_classs_other_store():
    location = _sites_of_a_window(fill_from_outside)
    assert location == f"Keeper.kept (tests/test_forensics.py:{_line('OUTSIDE-APPEND')})"


def test_storing_near_finds_the_append_after_the_line_that_made_the_item():
    from leakdoctor._base.source import storing_near

    line = _line("OUTSIDE-APPEND")
    assert storing_near(__file__, line - 1, "kept") == line  # made on the line before, appended on this one
    assert storing_near(__file__, line, "kept") == line
    assert storing_near(__file__, line, "other") is None


def test_jax_compiles_and_cache_misses_are_placed_at_the_users_call():
    import functools

    import jax
    import jax.numpy as jnp

    from leakdoctor.integrations._jax import CompileLog

    @functools.partial(jax.jit, static_argnums=1)
    def scaled(x, n):
        return x * n

    log = CompileLog()
    log.begin()
    try:
        for n in range(3):
            scaled(jnp.ones(3), n)  # JAX-CALL
    finally:
        activity = log.end(3)
    here = f"tests/test_forensics.py:{_line('JAX-CALL')}"
    assert activity.called_at("jit(scaled)") == here and activity.called_at("scaled") == here
    assert activity.misses and all(miss.called_at == here for miss in activity.misses)


def _window(steps: int, step: Any) -> tuple[Any, Any]:
    """The python integration's allocation diff and gc cycle census around `steps` calls of `step`, begun
    and ended in an investigation's order (the census ends before the diff)."""
    from leakdoctor.integrations._python import AllocationDiff, CycleCensus

    diff, census = AllocationDiff(), CycleCensus()
    census.begin()
    diff.begin()
    step()
    diff.baseline()
    for _ in range(steps):
        step()
    return census.end(steps), diff.end(steps)


def test_cyclic_garbage_the_running_collector_has_not_reached_is_not_counted_as_kept():
    """Garbage in reference cycles waits for the collector's next pass over its generation, alive: the
    allocation diff counted its buffers as kept (with the host buffers JAX releases from its gc callback,
    jax#14882: a Keras fit on JAX was a python_objects leak at its fit line). The sites the python_objects
    rule counts leave out what the gc cycle census found to be garbage, and still count what the loop keeps."""
    import gc

    from leakdoctor.integrations._python import _kept_sites

    kept: list = []

    class Node:
        def __init__(self) -> None:
            self.me = self
            self.payload = bytearray(100_000)  # CYCLE-PAYLOAD

    def step() -> None:
        Node()
        kept.append(bytearray(20_000))  # STEP-KEPT

    thresholds = gc.get_threshold()
    gc.set_threshold(1_000_000)  # the collector on, but not due within the window: the garbage waits
    try:
        cycles, growth = _window(8, step)
    finally:
        gc.set_threshold(*thresholds)
    raw = {site.location: site.size for site in growth.sites}
    sites = {site.location: site.size for site in _kept_sites(growth, cycles)}
    payload, appended = (f"tests/test_forensics.py:{_line(marker)}" for marker in ("CYCLE-PAYLOAD", "STEP-KEPT"))
    assert raw[payload] >= 8 * 100_000  # the garbage was alive when the diff was taken
    assert sites.get(payload, 0) < 100_000, sites
    assert sites[appended] >= 8 * 20_000
