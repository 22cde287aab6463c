"""The sampler thread (issue #23): resident memory watched off the training thread, a rise that wakes the
training thread, the memory alarm raised while a step runs, a forked child that steps with a thread of
its own, and the thread's CPU in the honest total. Real threads, real memory, a real fork."""

from __future__ import annotations

import gc
import json
import mmap
import os
import threading
import time

import psutil
import pytest

from leakdoctor import LeakDoctor
from leakdoctor.settings import Settings

MIB = 2**20


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "leakdoctor-sampler" and t.is_alive()]


def leaking_loop(doctor: LeakDoctor, steps: int, start: int, per_step: int, pause: float) -> list[bytearray]:
    """Steps that sleep `pause` (the GIL released, as a framework's kernels release it) and, from `start`
    on, keep `per_step` resident bytes each."""
    kept = []
    for i in range(steps):
        time.sleep(pause)
        if i >= start:
            kept.append(bytearray(b"x" * per_step))  # LEAK
        doctor.step()
    return kept


@pytest.mark.filterwarnings("ignore::leakdoctor._base.guard.LeakDoctorWarning")  # the projection to the limit
def test_a_leak_watched_off_the_training_thread_is_found_at_its_line_and_the_thread_is_in_the_total():
    per_step = int(0.01 * psutil.Process().memory_info().rss)
    with LeakDoctor(sampler="thread", verbose=False) as doctor:
        assert len(sampler_threads()) >= 1
        leaking_loop(doctor, 260, 60, per_step, 0.01)
    summary = doctor.summary
    (finding,) = [f for f in summary.findings if f.metric == "rss_bytes" and f.final_state == "leak"]
    assert finding.cause == "python_objects" and finding.where.endswith(f"test_sampler_thread.py:{_line('LEAK')}")
    assert 40 <= finding.first_step <= 120 and finding.detected_step <= 200
    overhead = summary.overhead
    assert overhead["sampling"] == "thread" and overhead["thread_cpu_seconds"] > 0
    assert overhead["total_seconds"] >= overhead["probe_seconds"] + overhead["thread_cpu_seconds"]


def test_the_thread_ends_with_finish_and_inline_starts_none():
    before = set(sampler_threads())
    doctor = LeakDoctor(verbose=False)
    (thread,) = set(sampler_threads()) - before
    assert thread.daemon  # it never keeps the process alive
    for _ in range(30):
        doctor.step()
    doctor.finish()
    thread.join(3)  # it exits when its sleep ends (at most a second)
    assert not thread.is_alive()
    before = set(sampler_threads())
    inline = LeakDoctor(sampler="inline", verbose=False)
    assert not set(sampler_threads()) - before
    for _ in range(30):
        inline.step()
    overhead = inline.finish().overhead
    assert overhead["sampling"] == "inline" and overhead["thread_cpu_seconds"] == 0


def resident(size: int) -> mmap.mmap:
    """`size` bytes of new resident memory, whatever malloc holds free already (memory freed before, which
    a malloc'ed block could reuse without growing resident memory): fresh anonymous pages, each written."""
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    return block


@pytest.mark.filterwarnings("ignore::leakdoctor._base.guard.LeakDoctorWarning")  # the projection to the limit
@pytest.mark.parametrize("sampler", ["auto", "inline"])
def test_the_post_mortem_is_written_while_a_step_still_runs(tmp_path, sampler):
    """One long step that allocates past the watermark: the thread writes the post-mortem before the step
    returns to `doctor.step()`; read inline, nothing is written until then."""
    path = tmp_path / "leaks.json"
    # The baseline without the garbage of the tests run before in this process: a full collection during
    # the test would free it and lower resident memory below the baseline (the watermark then out of
    # reach; xdist hands a worker different tests before this one depending on the machine's load)
    gc.collect()
    rss = psutil.Process().memory_info().rss
    limit = rss + 400 * MIB
    with LeakDoctor(summary_path=path, memory_limit=limit, oom_watermark=(rss + 150 * MIB) / limit, heartbeat=None,
                    sampler=sampler, verbose=False) as doctor:
        for _ in range(30):
            doctor.step()
        kept = []
        for _ in range(25):  # the 31st step: 25 × 8 MiB, some 200 MiB, without a call to the doctor
            kept.append(resident(8 * MIB))
            time.sleep(0.02)
        deadline = time.monotonic() + 5  # the thread's next tick: at most a second apart
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        written = json.loads(path.read_text()) if path.exists() else None
        steps_in_step = doctor.steps
        del kept[:]
        doctor.step()
    if sampler == "inline":
        assert written is None
        return
    assert written is not None, "no post-mortem while the step ran"
    oom = written["oom"]
    assert oom["imminent"] is True and oom["step"] == steps_in_step == 30
    assert oom["rss_bytes"] > rss + 100 * MIB and oom["limit_bytes"] == limit
    assert written["complete"] is False


def post_mortem_after_a_previous_tests_garbage(folder: str) -> str:
    """The post-mortem test, run as a worker of `make test` (pytest -n 2) may run it: after a test that left
    150 MiB of garbage in a reference cycle, in the oldest generation, which a full collection frees while
    the test runs (here: 0.3 s into it, in its long step)."""
    import pathlib

    class Cycle:
        def __init__(self) -> None:
            self.me = self
            self.block = resident(150 * MIB)

    kept = [Cycle()]
    gc.collect()  # the oldest generation
    del kept  # garbage there, until the next full collection
    threading.Timer(0.3, gc.collect).start()
    try:
        test_the_post_mortem_is_written_while_a_step_still_runs(pathlib.Path(folder), "auto")
    except AssertionError as err:
        return f"failed: {err}"
    return "passed"


def test_the_post_mortem_test_does_not_depend_on_what_ran_before(tmp_path):
    import warnings

    from helpers import isolated

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert isolated(post_mortem_after_a_previous_tests_garbage, str(tmp_path)) == "passed"


def test_a_forked_child_that_steps_reads_with_a_thread_of_its_own(tmp_path):
    doctor = LeakDoctor(sampler="thread", verbose=False)
    for _ in range(10):
        time.sleep(0.005)
        doctor.step()
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread did not survive the fork
        code = 1
        try:
            threads = len(sampler_threads())
            for _ in range(120):
                time.sleep(0.01)
                doctor.step()
            overhead = doctor.summary.overhead
            out.write_text(json.dumps({"before": threads, "after": len(sampler_threads()),
                                       "sampling": overhead["sampling"], "cpu": overhead["thread_cpu_seconds"]}))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child = json.loads(out.read_text())
    assert child["before"] == 0 and child["after"] == 1 and child["sampling"] == "thread"
    doctor.step()  # the parent's thread reads on
    assert doctor.finish().overhead["sampling"] == "thread"


@pytest.mark.parametrize("value", ["threads", None, 1, True])
def test_a_bad_sampler_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^sampler="):
        Settings.create(sampler=value)


def _line(marker: str) -> int:
    text = open(__file__).read().splitlines()
    return next(i for i, line in enumerate(text, 1) if line.rstrip().endswith(f"# {marker}"))
