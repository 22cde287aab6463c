"""Never the doctor's fault, round 4 (issue #37): each failure of the round-4 reliability sweep, reproduced on
the real code path (a real fork while the sampler thread writes, a real leak behind a failed engine, real
slow and hanging gauges, a real read-only folder, a real pipe closed early, a real ulimit, a real spawn Pool),
with the fixed behaviour asserted. Scenarios that fork or measure run in a fresh process
(tests/helpers.isolated)."""

from __future__ import annotations

import json

import pytest
from helpers import isolated

from leakdoctor import LeakDoctor
from leakdoctor.settings import Settings

# --- 1. a fork while the sampler thread holds the doctor's lock -------------------------------------------


def fork_while_the_thread_writes(children: int, folder: str) -> dict:
    """`children` times: a doctor whose sampler thread writes the post-mortem at once (memory_limit below
    resident memory), a fork while the thread holds the doctor's lock (seen from outside, by the lock's
    state), and a child that steps the inherited doctor 50 times and exits. Children still running after
    a generous wait are counted hung and killed."""
    import os
    import signal
    import time

    pids, held = [], 0
    for i in range(children):
        doctor = LeakDoctor(sampler="thread", memory_limit="20MiB", verbose=False,
                            summary_path=os.path.join(folder, f"run{i}.json"))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not repr(doctor._lock).startswith("<locked"):
            pass  # fork at the moment the thread holds the lock (it does for the post-mortem's write)
        held += repr(doctor._lock).startswith("<locked")
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(50):
                    doctor.step()
            finally:
                os._exit(0)
        pids.append(pid)
        doctor.finish()
    deadline, hung = time.monotonic() + 60, 0
    running = set(pids)
    while running and time.monotonic() < deadline:
        running = {pid for pid in running if os.waitpid(pid, os.WNOHANG)[0] == 0}
        time.sleep(0.05)
    for pid in running:
        hung += 1
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return {"hung": hung, "held": held, "children": children}


def test_a_child_forked_while_the_sampler_thread_writes_does_not_hang(tmp_path):
    result = isolated(fork_while_the_thread_writes, 20, str(tmp_path), timeout=300)
    assert result["held"] >= 1, result  # the fork did come while the thread held the lock
    assert result["hung"] == 0, result


# --- 5. a doctor whose engine switched itself off is not clean --------------------------------------------

def engine_off_at_step_one(path: str) -> dict:
    """A real 100 kB/step leak, watched by a doctor whose engine fails at its first sample: an integration's
    probe answers an array where a number belongs, which the engine (not the probe's guarded read) trips
    on."""
    import warnings

    import numpy as np

    from leakdoctor.integrations import FunctionProbe, Integration, MetricSpec

    odd = Integration("odd", probes=[FunctionProbe("odd", lambda: {"odd": np.array([1.0, 2.0])},
                                                   {"odd": MetricSpec("odd")})])
    kept = []
    with warnings.catch_warnings(record=True):
        with LeakDoctor(integrations=[odd], summary_path=path, memory_limit="2GiB", warmup=5, window=4,
                        overhead=1.0, verbose=False) as doctor:
            for _ in range(300):
                kept.append(np.ones(12_500))  # 100 kB a step, kept
                doctor.step()
    summary = doctor.summary
    return {"verdict": summary.verdict, "unwatched": summary.unwatched, "errors": summary.errors,
            "steps": summary.steps}


def test_a_doctor_whose_engine_switched_off_is_unwatched_not_clean(tmp_path):
    from leakdoctor.cli import main

    path = tmp_path / "leaks.json"
    result = isolated(engine_off_at_step_one, str(path))
    assert result["steps"] == 300, result
    assert [e["part"] for e in result["errors"]] == ["leakdoctor"], result  # the engine itself failed
    assert result["verdict"] == "unwatched", result
    assert result["errors"][0]["error"] in result["unwatched"]["reason"], result
    assert main(["report", str(path)]) == 3  # not a pass for a CI gate
    assert json.loads(path.read_text())["unwatched"]["reason"] == result["unwatched"]["reason"]


def engine_off_mid_investigation() -> dict:
    """A real 100 kB/step leak; an integration's probe answers a number until an investigation's tracer runs,
    then an array, which the engine trips on in the middle of the open window. Returns, after each step,
    whether tracemalloc traced, and the step at which the probe first saw it trace."""
    import tracemalloc
    import warnings

    import numpy as np

    from leakdoctor.integrations import FunctionProbe, Integration, MetricSpec

    step, seen = [0], []

    def read() -> dict:
        if not tracemalloc.is_tracing():
            return {"odd": 1.0}
        seen.append(step[0])
        return {"odd": np.array([1.0, 2.0])}

    odd = Integration("odd", probes=[FunctionProbe("odd", read, {"odd": MetricSpec("odd")})])
    kept, tracing = [], []
    with warnings.catch_warnings(record=True):
        with LeakDoctor(integrations=[odd], memory_limit="2GiB", warmup=5, window=4, overhead=1.0,
                        verbose=False) as doctor:
            for step[0] in range(1, 301):
                kept.append(np.ones(12_500))  # 100 kB a step, kept
                doctor.step()
                tracing.append(tracemalloc.is_tracing())
    return {"seen": seen, "tracing": tracing, "errors": doctor.summary.errors, "steps": doctor.summary.steps}


def test_a_doctor_that_switches_itself_off_mid_investigation_stops_its_tracer():
    result = isolated(engine_off_mid_investigation)
    assert result["seen"], result  # an investigation did open, and its tracer ran when the engine failed
    failed = result["seen"][0]
    assert [e["part"] for e in result["errors"]] == ["leakdoctor"], result["errors"]
    assert not any(result["tracing"][failed - 1:]), result["tracing"]  # from the failing step on, no tracer
    assert result["steps"] == 300


@pytest.mark.parametrize("option, value", [
    ("horizon", 10**400), ("warmup", 2**51), ("window", 10**400), ("investigate_steps", 10**400),
    ("verify_windows", 10**400), ("rank", 10**400), ("limit_margin", 10**400),
    ("heartbeat", 10**400), ("heartbeat", 1e-300), ("prometheus_linger", 10**400),
    ("memory_limit", 8), ("memory_limit", "0.0000001B"), ("memory_limit", "512KiB"),
], ids=lambda v: "10**400" if isinstance(v, int) and v > 10**100 else str(v))
def test_numeric_options_out_of_range_are_refused_by_name(option, value):
    with pytest.raises(ValueError, match=rf"^{option}="):
        LeakDoctor(verbose=False, **{option: value})


def test_numeric_options_at_their_bounds_are_taken():
    settings = Settings.create(horizon=10**12, heartbeat=0.01, memory_limit="1MiB", limit_margin=10**12,
                               prometheus_linger=0)
    assert (settings.horizon, settings.heartbeat, settings.memory_limit) == (10**12, 0.01, 2**20)


# --- 6. gauges: every call bounded by its timeout; slow gauges within the investigations' budget ------------

def gauge_quick_then_hanging(steps: int) -> dict:
    """A gauge that answers quickly three times and then hangs for good (a lock taken elsewhere), with a
    timeout of 1 s, beside a quick one."""
    import threading
    import time
    import warnings

    calls, never = [0], threading.Event()

    def then_hangs() -> float:
        calls[0] += 1
        if calls[0] > 3:
            never.wait()
        return 1.0

    with warnings.catch_warnings(record=True):
        doctor = LeakDoctor(verbose=False, overhead=1.0)
        doctor.watch("then_hangs", then_hangs, timeout=1.0)
        doctor.watch("quick", lambda: 3.0)
        for _ in range(steps):
            time.sleep(0.001)
            doctor.step()
        summary = doctor.finish()
    return {"steps": summary.steps, "errors": [e["part"] for e in summary.errors], "calls": calls[0],
            "quick": summary.series["quick"].end}


def test_a_gauge_that_was_quick_and_then_hangs_does_not_block_the_loop():
    result = isolated(gauge_quick_then_hanging, 100, timeout=120)
    assert result["steps"] == 100, result
    assert result["errors"] == ["gauge 'then_hangs'"] and result["calls"] == 4, result
    assert result["quick"] == 3.0, result


def slow_gauges_and_a_leak(gauges: int, steps: int) -> dict:
    """A real 100 kB/step leak, investigated, beside `gauges` gauges of 50 ms each (within their timeout):
    how often each gauge was called, and the most calls made within one step."""
    import collections
    import time
    import warnings

    import numpy as np

    calls: collections.Counter = collections.Counter()
    in_step: collections.Counter = collections.Counter()
    step = [0]

    def slow(i: int):
        def gauge() -> float:
            calls[i] += 1
            in_step[step[0]] += 1
            time.sleep(0.05)
            return 1.0
        return gauge

    kept = []
    with warnings.catch_warnings(record=True):
        doctor = LeakDoctor(verbose=False, overhead=1.0, warmup=5, window=4, memory_limit="2GiB")
        for i in range(gauges):
            doctor.watch(f"slow{i}", slow(i))
        for step[0] in range(steps):
            kept.append(np.ones(12_500))
            time.sleep(0.002)
            doctor.step()
        summary = doctor.finish()
    return {"verdict": summary.verdict, "investigations": summary.overhead["investigations"],
            "most_calls": max(calls.values()), "gauges_called": len(calls),
            "most_in_one_step": max(in_step.values()), "errors": summary.errors}


def test_slow_gauges_are_not_read_again_and_again_by_investigations():
    gauges = 20
    result = isolated(slow_gauges_and_a_leak, gauges, 200, timeout=300)
    assert result["verdict"] == "leak" and result["investigations"] >= 1, result
    assert result["gauges_called"] == gauges and not result["errors"], result  # every gauge was read
    # each ladder (3 an investigation, 3+ readings each) read every gauge afresh (10 calls a gauge for one
    # investigation): now a slow gauge is read by a ladder at most once
    assert result["most_calls"] <= 1 + 3 * result["investigations"], result
    assert result["most_in_one_step"] <= gauges // 4, result  # a read's budget spreads the gauges over steps


# --- 7. smaller ---------------------------------------------------------------------------------------------

def test_report_into_a_pipe_closed_early_ends_quietly(tmp_path):
    """`leakdoctor report f.json | head`: the reader is gone before the report is printed."""
    import subprocess
    import sys

    from procs import env

    path = tmp_path / "leaks.json"
    with LeakDoctor(summary_path=path, verbose=False) as doctor:
        for _ in range(5):
            doctor.step()
    expected = 3  # 5 steps: unwatched
    process = subprocess.Popen([sys.executable, "-m", "leakdoctor", "report", str(path)], env=env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # as `head` does once it has its lines (here: before any)
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == expected, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def gather_without_the_other_rank(rank: int, port: int, folder: str, conn: object) -> None:
    """Two gloo ranks; rank 1 steps, reports, and dies before finish() (os._exit: its end of the
    connection closes), so rank 0's gathering of the summaries fails."""
    import os
    import time
    import warnings

    import torch.distributed as dist

    from helpers import report_to

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    doctor = TorchDoctor(summary_path=os.path.join(folder, "leaks.json"), verbose=False)
    for _ in range(30):
        doctor.step()
    dist.barrier()
    if rank == 1:
        report_to(conn, lambda: {"rank": 1})
        os._exit(0)

    def finish() -> dict:
        time.sleep(1.0)  # rank 1 is gone by now
        summary = doctor.finish()
        written = json.loads(open(os.path.join(folder, "leaks.json")).read())
        return {"errors": summary.errors, "written": written["errors"]}

    report_to(conn, finish)


def test_a_failed_gathering_on_rank_0_is_in_the_summarys_errors(tmp_path):
    from helpers import run_ranks

    result = run_ranks(gather_without_the_other_rank, str(tmp_path), timeout=240)[0]
    parts = [e["part"] for e in result["errors"]]
    assert "complete summary" in parts, result  # the gathering failed, and the summary says so
    assert [e["part"] for e in result["written"]] == parts, result  # in the file written too


def unfinished_doctors_under_ulimit(limit: int, doctors: int, folder: str) -> dict:
    """Under a real `ulimit -n <limit>`: `doctors` inline doctors that step and stay referenced, never
    finished (more of them than the limit), then the user's own code opens as many files as the limit
    leaves room for beside one doctor's descriptor."""
    import resource
    import warnings
    from pathlib import Path

    import psutil

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    used = psutil.Process().num_fds()
    kept = []
    with warnings.catch_warnings(record=True):
        for _ in range(doctors):
            doctor = LeakDoctor(sampler="inline", verbose=False, overhead=1.0)
            for _ in range(3):
                doctor.step()
            kept.append(doctor)
    held = psutil.Process().num_fds() - used
    room = limit - used - 1  # all but one descriptor, the doctors'
    files = []
    try:
        for i in range(room):
            files.append(open(Path(folder) / f"user-{i}.txt", "w"))
    except OSError as err:
        return {"opened": len(files), "room": room, "held": held, "error": str(err)}
    finally:
        for fh in files:
            fh.close()
    read = all(d.readings.get("rss_bytes", 0) > 0 for d in kept)
    return {"opened": len(files), "room": room, "held": held, "read": read}


def test_doctors_never_finished_share_one_descriptor(tmp_path):
    result = isolated(unfinished_doctors_under_ulimit, 64, 100, str(tmp_path))
    assert result["held"] <= 1, result
    assert result["opened"] == result["room"] > 10, result
    assert result["read"], result


def unfinished_auto_doctors(doctors: int) -> dict:
    """`doctors` doctors with the default sampler, stepped with short steps (where the sampler thread's
    budget buys no reading a window) and no summary path (no memory limit to write a post-mortem at), kept
    referenced and never finished: the sampler threads still alive."""
    import threading
    import time

    kept = [LeakDoctor(verbose=False, overhead=1.0) for _ in range(doctors)]
    deadline = time.monotonic() + 1.0  # short steps, while each thread measures its cost per reading
    while time.monotonic() < deadline:
        for doctor in kept:
            doctor.step()

    def alive() -> int:
        return sum(t.name == "leakdoctor-sampler" and t.is_alive() for t in threading.enumerate())

    deadline = time.monotonic() + 20  # a thread (re)started by the last steps measures its cost first
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    modes = {d.summary.overhead.get("sampling") for d in kept}
    return {"alive": alive(), "modes": sorted(modes)}


def test_doctors_never_finished_with_nothing_to_watch_on_a_thread_hold_none():
    result = isolated(unfinished_auto_doctors, 10, timeout=300)
    assert result["modes"] == ["inline"], result
    assert result["alive"] == 0, result
