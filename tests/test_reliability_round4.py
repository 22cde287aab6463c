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
