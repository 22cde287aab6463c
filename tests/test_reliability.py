"""Never the doctor's fault (issue #15): each failure found by the reliability sweep, reproduced on the
real code path (a real leaking loop, real files, a real fork, a real ulimit, real threads), with the
fixed behaviour asserted. Scenarios that measure memory run in a fresh process (tests/helpers.isolated).
(The Lightning ones are in test_lightning.py.)"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import isolated, says

from leakdoctor import LeakDoctor, LeakDoctorWarning
from leakdoctor.integrations import FunctionProbe, Integration, MetricSpec
from leakdoctor._base import trend as detect

pytest_plugins = ["pytester"]

#: Fixed so that materiality does not depend on the RAM of the machine running the tests.
LIMIT = "2GiB"


def strict_json(text: str) -> Any:
    """Parse as a strict JSON parser would: NaN, Infinity and -Infinity are not JSON."""
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def broken_probe() -> Integration:
    """An integration whose probe raises on its first read."""
    def read() -> dict[str, float]:
        raise RuntimeError("the probe broke")

    return Integration("broken", probes=[FunctionProbe("broken", read, {"broken": MetricSpec("broken")})])


def leaking_loop(doctor: LeakDoctor, steps: int, per_step: int = 25_000) -> list[np.ndarray]:
    """A real leak: every step keeps an array of `per_step` float64 (200 kB by default)."""
    kept = []
    for _ in range(steps):
        kept.append(np.ones(per_step))
        doctor.step()
    return kept


# --- 1. NaN and inf readings ---------------------------------------------------------------------------

def leak_beside_a_bad_gauge(path: str) -> dict:
    """A 200 kB/step leak next to a gauge that reads NaN every 7th call and inf every 11th."""
    calls = itertools.count()

    def ratio() -> float:
        n = next(calls)
        return math.nan if n % 7 == 0 else math.inf if n % 11 == 0 else 0.5

    doctor = LeakDoctor(overhead=1.0, memory_limit=LIMIT, summary_path=path, verbose=False)
    doctor.watch("ratio", ratio)
    leaking_loop(doctor, 300)
    summary = doctor.finish()
    return {"verdict": summary.verdict, "steps": summary.steps, "errors": summary.errors, "notes": summary.notes,
            "leaks": [(f.cause, f.metric) for f in summary.leaks], "text": Path(path).read_text()}


def test_a_nan_gauge_is_skipped_and_the_leak_beside_it_is_found(tmp_path):
    result = isolated(leak_beside_a_bad_gauge, str(tmp_path / "leaks.json"))
    assert result["steps"] == 300 and result["errors"] == []  # the doctor never switched itself off
    assert result["verdict"] == "leak" and ("rss_bytes" in {m for _, m in result["leaks"]}), result
    skipped = [n for n in result["notes"] if says(n, "nan_readings", metric="ratio")]
    assert len(skipped) == 1, result["notes"]  # flagged once
    assert says(skipped[0], "nan_readings", metric="ratio", step=1), result["notes"]
    data = strict_json(result["text"])
    ratio = data["series"]["ratio"]
    assert ratio["end"] == 0.5 and ratio["peak"] == 0.5 and all(v == 0.5 for _, v in ratio["points"])


def test_non_finite_values_are_written_as_null_in_strict_json(tmp_path):
    doctor = LeakDoctor(verbose=False, summary_path=tmp_path / "leaks.json")
    summary = doctor.finish()
    summary.overhead["fraction_of_step_time"] = math.inf
    summary.settings["memory_limit"] = np.float32("nan")
    summary.notes.append("fine")
    data = strict_json(summary.to_json())
    assert data["overhead"]["fraction_of_step_time"] is None and data["settings"]["memory_limit"] is None
    assert data["notes"] == ["fine"]


@pytest.mark.parametrize("n", [3, 7, 12, 13, 48, 200])
def test_trend_statistics_never_raise_on_non_finite_values(n):
    x = np.arange(n) * 3
    for poison in (math.nan, math.inf, -math.inf):
        y = np.cumsum(np.ones(n))
        y[:: max(2, n // 3)] = poison
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for data in (y, list(y)):
                detect.mann_kendall(data)
                detect.theil_sen(x, data)
            detect.assess(x, y, 0.01)
            detect.classify(x, y, 2, 0.01)


# --- 2. warnings as errors -------------------------------------------------------------------------------

def failing_parts_under_warnings_as_errors(path: str, category: str) -> dict:
    """A failing gauge and a failing probe beside a leak, with LeakDoctorWarning (or every warning) made an
    error: nothing escapes step() or finish(), and the summary is written."""
    warnings.simplefilter("error", LeakDoctorWarning if category == "leakdoctor" else Warning)
    doctor = LeakDoctor(overhead=1.0, memory_limit=LIMIT, summary_path=path, verbose=False,
                        integrations=[broken_probe()])
    doctor.watch("bad", lambda: 1 / 0)
    leaking_loop(doctor, 300)
    summary = doctor.finish()
    return {"verdict": summary.verdict, "steps": summary.steps, "parts": [e["part"] for e in summary.errors],
            "written": json.loads(Path(path).read_text())["verdict"]}


@pytest.mark.parametrize("category", ["leakdoctor", "all"])
def test_warnings_as_errors_never_reach_the_loop(tmp_path, category):
    result = isolated(failing_parts_under_warnings_as_errors, str(tmp_path / "leaks.json"), category)
    assert sorted(result["parts"]) == ["gauge 'bad'", "probe broken"], result
    assert result["steps"] == 300 and result["verdict"] == result["written"] == "leak"


def test_a_failure_still_warns_when_warnings_are_not_errors(tmp_path):
    doctor = LeakDoctor(verbose=False)
    doctor.watch("bad", lambda: 1 / 0)
    with pytest.warns(LeakDoctorWarning, match="gauge 'bad' failed"):
        for _ in range(3):
            doctor.step()
    assert [e["part"] for e in doctor.finish().errors] == ["gauge 'bad'"]


# --- 3. polling the summary ------------------------------------------------------------------------------

def summary_polls(polls: int, steps_between: int) -> dict:
    """A long run (900k steps, its history full at up to 1024 points) whose summary is polled `polls`
    times, each at a different history length: resident memory after each poll, the history lengths
    seen, and how many of the longest history's points the summary's whole-run fits read."""
    import psutil

    from leakdoctor._judging import stopped

    process = psutil.Process()
    doctor = LeakDoctor(overhead=1.0, verbose=False)
    rss, lengths = [], set()
    for _ in range(polls):
        for _ in range(steps_between):
            doctor.step()
        points = doctor.summary.series["rss_bytes"].points
        lengths.add(len(points))
        rss.append(process.memory_info().rss)
        if rss[-1] - rss[0] > 256 * 2**20:  # the unbounded cache again: stop before it costs the machine
            break
    steps, values = map(np.asarray, zip(*points))
    return {"rss": rss, "lengths": len(lengths), "points": len(points),
            "fitted": len(stopped.thinned(steps, values)[1]), "most": stopped.FIT_POINTS}


def test_polling_the_summary_keeps_memory_flat_and_reads_a_bounded_history():
    result = isolated(summary_polls, 300, 3000)
    rss = result["rss"]
    assert len(rss) == 300 and result["lengths"] > 100  # the history length changed between polls
    per_poll = (rss[-1] - rss[50]) / 250
    assert per_poll < 16 * 2**10, f"resident memory grew {per_poll / 2**10:.0f} KiB per poll"
    # A snapshot's fits read at most FIT_POINTS of a long history: Theil-Sen and
    # Mann-Kendall cost the square of the points they read (before: 100x a short history's cost).
    assert result["fitted"] <= result["most"] < result["points"], result


@pytest.mark.parametrize("n", [10, 64, 65, 500])
def test_pair_caches_are_bounded(n):
    detect.theil_sen(np.arange(n), np.arange(n) * 2.0)
    detect.mann_kendall(np.arange(n) * 1.0)
    info = detect._cached_pairs.cache_info()
    assert info.maxsize == detect._CACHED_PAIRS and info.currsize <= info.maxsize
    for m in range(3, 200):  # exact p-values for the short series, the normal approximation beyond
        detect.mann_kendall(np.arange(m) * 1.0)
    inversions = detect._inversion_cdf.cache_info()
    assert inversions.maxsize is not None and 0 < inversions.currsize <= inversions.maxsize


# --- 4. file descriptors -----------------------------------------------------------------------------------

def run_briefly(doctor: LeakDoctor, steps: int = 3) -> LeakDoctor:
    """A few steps (the first is sampled, so every probe has read), then finish."""
    for _ in range(steps):
        doctor.step()
    doctor.finish()
    return doctor


def open_fds_after_doctors(count: int) -> tuple[int, int, int]:
    """Open descriptors before `count` doctors, with one running, and after all of them finished."""
    import psutil

    process = psutil.Process()
    before = process.num_fds()
    running = LeakDoctor(verbose=False)
    running.step()
    during = process.num_fds()
    for _ in range(count):
        run_briefly(LeakDoctor(verbose=False))
    running.finish()
    return before, during, process.num_fds()


def test_a_thousand_doctors_leave_no_open_descriptor():
    before, during, after = isolated(open_fds_after_doctors, 1000)
    assert during <= before + 1  # a running doctor holds at most /proc/self/statm
    assert after == before


def user_files_under_ulimit(limit: int, doctors: int, folder: str) -> dict:
    """Under a real `ulimit -n <limit>`: `doctors` doctors run and finish, one more keeps running, then the
    user's own code opens as many files as the limit leaves room for."""
    import resource

    import psutil

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    used = psutil.Process().num_fds()
    read = [("rss_bytes" in run_briefly(LeakDoctor(verbose=False)).summary.series) for _ in range(doctors)]
    running = LeakDoctor(verbose=False)
    running.step()
    room = limit - used - 1  # all but the running doctor's descriptor
    files = []
    try:
        for i in range(room):
            files.append(open(Path(folder) / f"user-{i}.txt", "w"))
    except OSError as err:
        return {"opened": len(files), "room": room, "error": str(err)}
    finally:
        for fh in files:
            fh.close()
    return {"opened": len(files), "room": room, "read": all(read), "rss": running.readings.get("rss_bytes", 0.0)}


def test_doctors_do_not_eat_the_users_descriptors_under_ulimit(tmp_path):
    result = isolated(user_files_under_ulimit, 64, 200, str(tmp_path))
    assert result["opened"] == result["room"] > 10, result
    assert result["read"] and result["rss"] > 0, result


def rss_after_fork(mib: int) -> dict:
    """A doctor running before os.fork(); the child allocates `mib` MiB and steps on: its reading must be
    its own resident memory, and the parent's must not grow with the child's."""
    import os
    import time

    import psutil

    def steps(doctor: LeakDoctor, n: int) -> float:
        for _ in range(n):
            time.sleep(0.002)  # a step long enough for every one to be sampled
            doctor.step()
        return doctor.readings["rss_bytes"]

    doctor = LeakDoctor(verbose=False, overhead=1.0)
    parent_before = steps(doctor, 30)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            block = np.ones(mib * 2**20 // 8)  # written, so resident
            reading = steps(doctor, 30)
            os.write(write_end, json.dumps([reading, psutil.Process().memory_info().rss, block.size]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as fh:
        child_reading, child_rss, _ = json.loads(fh.read())
    os.waitpid(pid, 0)
    parent_after = steps(doctor, 30)
    doctor.finish()
    return {"parent_before": parent_before, "parent_after": parent_after, "child": child_reading,
            "child_rss": child_rss}


def test_after_a_fork_the_child_reads_its_own_memory():
    mib = 256
    r = isolated(rss_after_fork, mib)
    assert r["child"] - r["parent_before"] > 0.8 * mib * 2**20, r  # the child's reading grew with its block
    assert abs(r["child"] - r["child_rss"]) < 0.1 * r["child_rss"], r  # and is the child's own, per psutil
    assert r["parent_after"] - r["parent_before"] < 0.2 * mib * 2**20, r  # the parent's did not


# --- 6. inputs that switched detection off ---------------------------------------------------------------

@pytest.mark.parametrize("limit", [math.inf, -math.inf, math.nan, np.float64("inf")])
def test_a_non_finite_memory_limit_is_refused(limit):
    with pytest.raises(ValueError, match=r"memory_limit=.*(inf|nan).*finite"):
        LeakDoctor(memory_limit=limit)


@pytest.mark.parametrize("limit", [10**400, "1e400GiB", "9" * 400 + "GiB"])
def test_a_memory_limit_too_large_for_a_float_is_a_value_error_naming_the_argument(limit):
    with pytest.raises(ValueError, match=r"^memory_limit="):
        LeakDoctor(memory_limit=limit)


def test_a_gauge_cannot_take_a_built_in_series_name():
    doctor = LeakDoctor(verbose=False, integrations=[broken_probe()])
    for name in ("rss_bytes", "step_seconds", "step_cpu_seconds", "workers_grown_bytes", "workers_new_bytes",
                 "broken"):
        with pytest.raises(ValueError, match=rf"watch: name '{name}' must be a new name.*'rss_bytes'"):
            doctor.watch(name, lambda: 1.0)
    doctor.watch("nodes", lambda: 1.0)
    with pytest.raises(ValueError, match="must be a new name"):
        doctor.watch("nodes", lambda: 2.0)
    doctor.finish()


def test_a_gauge_cannot_take_a_framework_series_name():
    pytest.importorskip("torch")
    from torch import nn

    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    doctor = TorchDoctor(model=nn.Linear(2, 2), verbose=False)
    with pytest.raises(ValueError, match="'torch_hooks' must be a new name"):
        doctor.watch("torch_hooks", lambda: 1.0)
    doctor.finish()


# --- 7. leakdoctor report on a malformed file ------------------------------------------------------------

def summary_of_a_run(path: str, leak: bool) -> dict:
    doctor = LeakDoctor(overhead=1.0, memory_limit=LIMIT, summary_path=path, verbose=False)
    leaking_loop(doctor, 300, per_step=25_000 if leak else 1)
    doctor.finish()
    return json.loads(Path(path).read_text())


def a_summary(tmp_path: Path, leak: bool = True) -> dict:
    """A real summary (a real leaking, or clean, loop, in a fresh process), as the JSON the doctor wrote."""
    summary = isolated(summary_of_a_run, str(tmp_path / "real.json"), leak)
    assert summary["verdict"] == ("leak" if leak else "clean"), summary
    return summary


def report(path: Path, capsys) -> tuple[int, str, str]:
    from leakdoctor.cli import main

    code = main(["report", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def broken(data: dict, change: str) -> str:
    """`data` damaged one way, as JSON text."""
    data = json.loads(json.dumps(data))
    if change == "series as a list":
        data["series"] = list(data["series"].values())
    elif change == "string steps":
        data["steps"] = "300"
    elif change == "finding without fields":
        data["findings"][0] = {"cause": data["findings"][0]["cause"], "metric": "rss_bytes"}
    elif change == "unknown cause":
        data["findings"][0]["cause"] = "gremlins"
    elif change == "remedy not an object":
        data["findings"][0]["remedy"] = [1, 2]
    elif change == "points not pairs":
        data["series"]["rss_bytes"]["points"] = [[1, 2, 3]]
    elif change == "notes not strings":
        data["notes"] = [{"a": 1}]
    elif change == "deep nesting":
        return "[" * 5000 + json.dumps(data) + "]" * 5000
    return json.dumps(data)


@pytest.mark.parametrize("content, message", [
    ("[1, 2, 3]", "expected a JSON object"),
    ('"a summary"', "expected a JSON object"),
    ('{"schema": "something/1"}', "not a leakdoctor summary"),
    ("{\"schema\": ", "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_report_on_a_file_that_is_no_summary_exits_2_with_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "leaks.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = report(path, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("change, message", [
    ("series as a list", "summary.series: expected an object of series, got a list"),
    ("string steps", "summary.steps: expected a whole number of steps, got a string"),
    ("finding without fields", "findings[0]: missing 'unit'"),
    ("unknown cause", "findings[0].cause: expected a cause"),
    ("remedy not an object", "findings[0].remedy: expected an object or null, got a list"),
    ("points not pairs", "series['rss_bytes'].points: expected a list of [step, value] pairs"),
    ("notes not strings", "summary.notes: expected a list of records (or strings)"),
    ("deep nesting", "nested too deeply"),
])
def test_report_on_a_damaged_summary_exits_2_with_one_line(tmp_path, capsys, change, message):
    path = tmp_path / "leaks.json"
    path.write_text(broken(a_summary(tmp_path), change))
    code, out, err = report(path, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_report_strips_terminal_escape_sequences(tmp_path, capsys):
    data = a_summary(tmp_path)
    evil = "\x1b[2J\x1b]0;owned\x07\x1b[31mred\x1b[0m\rverdict CLEAN\x9b1m\u202e"
    data["notes"].append(evil)
    data["findings"][0]["evidence"] = {"code": "text", "params": {"text": evil}}  # a record's text, rendered
    data["series"][evil] = data["series"]["rss_bytes"]
    path = tmp_path / "leaks.json"
    path.write_text(json.dumps(data))
    code, out, err = report(path, capsys)
    assert code == 1 and err == ""
    assert not any(c in out for c in "\x1b\x07\r\x9b\u202e"), repr(out)
    assert "note: red verdict CLEAN" in out  # the text stays, the control is gone


def test_report_refuses_a_huge_file_without_reading_it(tmp_path, capsys):
    path = tmp_path / "leaks.json"
    with open(path, "wb") as fh:
        fh.truncate(300 * 2**20)  # a 300 MB file (sparse: it costs no disk)
    code, out, err = report(path, capsys)
    assert code == 2 and "larger than 64 MiB" in err and err.count("\n") == 1


def test_report_exit_codes_from_the_command_line(tmp_path):
    import subprocess
    import sys

    leaky, clean = tmp_path / "leak", tmp_path / "clean"
    leaky.mkdir()
    clean.mkdir()
    (tmp_path / "leak.json").write_text(json.dumps(a_summary(leaky)))
    (tmp_path / "clean.json").write_text(json.dumps(a_summary(clean, leak=False)))
    (tmp_path / "bad.json").write_text("[]")
    codes = {name: subprocess.run([sys.executable, "-m", "leakdoctor.cli", "report", str(tmp_path / f"{name}.json")],
                                  capture_output=True, text=True).returncode
             for name in ("leak", "clean", "bad", "missing")}
    assert codes == {"leak": 1, "clean": 0, "bad": 2, "missing": 2}


# --- 8. the pytest plugin's verdict does not depend on the runner's memory ---------------------------------

PLUGIN_TESTS = '''
import numpy as np
import pytest

KEPT = []

def leak_20kb():
    KEPT.append(np.ones(2_500))      # 20 kB a step, kept

@pytest.mark.parametrize("limit", ["2GiB", None])
def test_fixture_leak(leak_check, limit):
    leak_check(leak_20kb, steps=300, memory_limit=limit)

@pytest.mark.parametrize("limit", ["2GiB", None])
def test_fixture_clean(leak_check, limit):
    summary = leak_check(lambda: np.ones(2_500).sum(), steps=300, memory_limit=limit)
    assert summary.steps == 300

def test_fixture_leak_under_a_higher_threshold(leak_check):
    leak_check(leak_20kb, steps=300, max_bytes_per_step=1_000_000)

@pytest.mark.leakcheck(steps=300, memory_limit="2GiB")
def test_marked_leak_2gib():
    leak_20kb()

@pytest.mark.leakcheck(steps=300)
def test_marked_leak_ram():
    leak_20kb()

def test_bad_threshold(leak_check):
    with pytest.raises(ValueError, match="max_bytes_per_step=-1"):
        leak_check(leak_20kb, steps=3, max_bytes_per_step=-1)
'''


def test_leak_check_verdict_is_the_same_whatever_the_memory_limit(pytester):
    """The same 20 kB/step leak fails with memory_limit="2GiB" and with the machine's memory (before: it
    passed where the machine had more than ~20 GiB); a clean step passes with both."""
    pytester.makepyfile(PLUGIN_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-p", "no:randomly")
    result.assert_outcomes(passed=4, failed=4)
    result.stdout.fnmatch_lines_random([
        "*FAILED*test_fixture_leak?2GiB?*", "*FAILED*test_fixture_leak?None?*",
        "*FAILED*test_marked_leak_2gib*", "*FAILED*test_marked_leak_ram*",
        "*the step leaks memory: python_objects on rss_bytes (*KiB/step); max_bytes_per_step=4096*"])


# --- 10. smaller ones -----------------------------------------------------------------------------------------

def modes_under_umasks(folder: str) -> dict:
    import os

    modes = {}
    for umask in (0o022, 0o077, 0o002):
        os.umask(umask)
        path = Path(folder) / f"leaks-{umask:03o}.json"
        run_briefly(LeakDoctor(verbose=False, summary_path=path))
        modes[f"{umask:03o}"] = f"{path.stat().st_mode & 0o777:03o}"
    return modes


def test_summary_files_honour_the_umask(tmp_path):
    assert isolated(modes_under_umasks, str(tmp_path)) == {"022": "644", "077": "600", "002": "664"}


AT_EXIT = """
import gc
import sys
from leakdoctor import LeakDoctor

def train(path):
    doctor = LeakDoctor(summary_path=path)   # never finished, and unreachable once train returns
    for _ in range(80):
        doctor.step()

train(sys.argv[1])
gc.collect()   # as happens sooner or later in any program: the doctor's own cycles are collected
"""


def test_a_doctor_built_in_a_function_that_returned_writes_its_summary_at_exit(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "leaks.json"
    run = subprocess.run([sys.executable, "-c", AT_EXIT, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(path.read_text())["steps"] == 80
    assert says(run.stderr, "headline", framework="python", steps=80, verdict="CLEAN"), run.stderr  # and it says so


def test_a_relative_summary_path_survives_a_chdir(tmp_path, monkeypatch):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(start)
    doctor = LeakDoctor(verbose=False, summary_path="out/leaks.json", plot_path="out/leaks.png")
    monkeypatch.chdir(elsewhere)
    run_briefly(doctor)
    assert (start / "out" / "leaks.json").exists() and not (elsewhere / "out").exists()
    assert doctor.settings.plot_path == start / "out" / "leaks.png"


def write_huge_summaries(path: str) -> None:
    """Write a large summary over and over (each write takes a while), until killed."""
    doctor = LeakDoctor(verbose=False)
    summary = doctor.finish()
    summary.notes.append("x" * 64 * 2**20)
    while True:
        summary.write(path)


def test_a_write_killed_midway_leaves_no_stray_temporary_file(tmp_path):
    import multiprocessing
    import os
    import signal
    import time

    path = tmp_path / "leaks.json"
    writer = multiprocessing.get_context("spawn").Process(target=write_huge_summaries, args=(str(path),))
    writer.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # stopped in the middle of a write (its temporary file there), then killed
        if list(tmp_path.glob(".leaks.json.*.tmp")):
            os.kill(writer.pid, signal.SIGSTOP)
            if list(tmp_path.glob(".leaks.json.*.tmp")):
                break
            os.kill(writer.pid, signal.SIGCONT)  # it renamed the file in between: wait for the next write
        time.sleep(0.01)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(30)
    stray = list(tmp_path.glob(".leaks.json.*.tmp"))
    assert len(stray) == 1, stray  # what a SIGKILL leaves behind
    an_hour_ago = time.time() - 3600
    os.utime(stray[0], (an_hour_ago, an_hour_ago))  # ... found by a later run
    live = tmp_path / f".leaks.json.{os.getpid() + 1}.0000.tmp"  # a write in progress right now, elsewhere
    live.write_text("")
    run_briefly(LeakDoctor(verbose=False, summary_path=path))
    assert not stray[0].exists() and live.exists()
    assert json.loads(path.read_text())["steps"] == 3


def ddp_rank_that_raises(rank: int, port: int, folder: str) -> None:
    """One of two gloo ranks of a plain torch loop that raises on every rank at step 20."""
    import torch.distributed as dist

    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        with TorchDoctor(summary_path=Path(folder) / "leaks.json", verbose=False) as doctor:
            for step in range(1, 31):
                doctor.step()
                if step == 20:
                    raise RuntimeError("the data went bad")
    except RuntimeError:
        pass
    finally:
        dist.destroy_process_group()


def test_after_a_ddp_exception_rank_0_says_the_ranks_were_not_gathered(tmp_path):
    pytest.importorskip("torch")
    import multiprocessing
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=ddp_rank_that_raises, args=(rank, port, str(tmp_path))) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(300)
    assert [p.exitcode for p in ranks] == [0, 0]
    # rank 0 writes its own summary alone; rank 1, whose summary was not gathered, its own beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaks.json", "leaks.rank1.json"]
    summary = strict_json((tmp_path / "leaks.json").read_text())
    assert summary["rank"] == 0 and summary["steps"] == 20 and summary["ranks"] == []
    assert says(summary["notes"], "ended_unmerged", "not_gathered", "rank_alone", error="RuntimeError", others=1,
                rank=0), summary["notes"]
    own = strict_json((tmp_path / "leaks.rank1.json").read_text())
    assert own["rank"] == 1 and own["steps"] == 20 and says(own["notes"], "not_gathered", "rank_alone", rank=1)


def two_threads_one_doctor(steps: int) -> dict:
    """Two threads step one doctor on a real leak (24 kB a step each), a third polls the summary and the
    readings, and a gauge and a watched list are added mid-run."""
    import threading

    doctor = LeakDoctor(verbose=False, overhead=1.0, warmup=5, memory_limit=LIMIT)
    kept: list[np.ndarray] = []
    done = threading.Event()

    def train() -> None:
        for i in range(steps):
            kept.append(np.ones(3_000))
            if i == steps // 2:
                doctor.watch_object(kept, f"kept{threading.get_ident()}")
            doctor.step()

    def poll() -> None:
        while not done.is_set():
            doctor.summary
            doctor.readings

    trainers = [threading.Thread(target=train) for _ in range(2)]
    poller = threading.Thread(target=poll)
    poller.start()
    for thread in trainers:
        thread.start()
    doctor.watch("items", lambda: float(len(kept)))
    for thread in trainers:
        thread.join()
    done.set()
    poller.join()
    summary = doctor.finish()
    return {"steps": summary.steps, "errors": summary.errors, "verdict": summary.verdict}


def test_one_doctor_stepped_from_two_threads_stays_on():
    result = isolated(two_threads_one_doctor, 1500)
    assert result == {"steps": 3000, "errors": [], "verdict": "leak"}


def keras_fit_with_warnings_as_errors(folder: str) -> dict:
    """Keras (jax backend): a misspelt option, then a fit whose callback (given `integrations=`) has a probe
    that fails, with LeakDoctorWarning made an error."""
    import os

    os.environ["KERAS_BACKEND"] = "jax"
    warnings.filterwarnings("ignore")
    import keras

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    try:
        LeakDoctorCallback(remedys="safe")
        misspelt = None
    except ValueError as err:
        misspelt = str(err)
    warnings.simplefilter("error", LeakDoctorWarning)
    path = Path(folder) / "leaks.json"
    callback = LeakDoctorCallback(verbose=False, summary_path=path, integrations=[broken_probe()])
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    model.fit(x, x[:, :1], epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    summary = callback.finish()
    return {"misspelt": misspelt, "parts": [e["part"] for e in summary.errors],
            "written": json.loads(path.read_text())["errors"]}


def test_keras_callback_options_and_warnings_as_errors(tmp_path):
    result = isolated(keras_fit_with_warnings_as_errors, str(tmp_path))
    assert result["misspelt"].startswith("leakdoctor.callbacks.keras.LeakDoctorCallback: unknown option 'remedys': "
                                         "did you mean 'remedies'? (valid options: ")
    assert "call_options" in result["misspelt"] and "log_prefix" in result["misspelt"]
    assert "probe broken" in " ".join(result["parts"]) and result["written"]  # the fit went on, and was written
