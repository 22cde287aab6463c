"""A summary that survives SIGKILL (issue #23): while a run goes, its summary is on disk, marked
`"complete": false` with `written_at`; a finding is written as soon as it is made; a run killed with
SIGKILL (which no handler sees) leaves the finding, its state and its line; a run that finishes writes
`"complete": true`; `leakdoctor report` says an incomplete summary's run did not finish; past
`oom_watermark` of the memory limit the post-mortem is written at once. Real processes and real signals."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from leakdoctor._base.schema import SCHEMA
from helpers import counts, isolated, says, place

from leakdoctor import LeakDoctor
from leakdoctor.cli import main as cli
from leakdoctor._base.guard import LeakDoctorWarning
from leakdoctor.settings import Settings
from procs import SCRIPTS, Watched, leakdoctor_run, run

SCRIPT = SCRIPTS / "heartbeat_loop.py"


def line_of(marker: str, path: Path = SCRIPT) -> int:
    """The line of `path` that carries `# <marker>:`."""
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if f"# {marker}:" in text)


def poll(path: Path, watched: Watched, until, timeout: float = 90) -> dict:
    """Read the summary at `path` until `until(summary)` holds; every read must be whole JSON (the writes
    are atomic). Fails, with the process's output, if the process ends first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and watched.process.poll() is None:
        try:
            summary = json.loads(path.read_text())
        except FileNotFoundError:
            summary = None
        if summary is not None and until(summary):
            return summary
        time.sleep(0.05)
    watched.kill()
    watched.finish()
    last = path.read_text() if path.exists() else "no file"
    raise AssertionError(f"the summary never got there (exit {watched.process.returncode}):\n{last[:3000]}\n"
                         f"{watched.stdout}\n{watched.stderr}")


def kept_leak(summary: dict) -> dict | None:
    """The finding of the loop's leak (the KEPT line), if the summary has it as a leak."""
    where = f"heartbeat_loop.py:{line_of('KEPT')}"
    return next((f for f in summary["findings"] if (place(f) or "").endswith(where) and counts(f)), None)


def test_a_run_killed_with_sigkill_leaves_its_finding_on_disk(tmp_path):
    path = tmp_path / "leaks.json"
    watched = Watched([sys.executable, SCRIPT, "leak", tmp_path, "0.15", "3000"], cwd=tmp_path)
    try:
        seen = poll(path, watched, kept_leak)
        assert seen["complete"] is False
        watched.process.send_signal(signal.SIGKILL)
        assert watched.finish() == -signal.SIGKILL
    finally:
        watched.kill()
    summary = json.loads(path.read_text())  # what the kill left: whole JSON
    assert summary["schema"] == SCHEMA
    assert summary["complete"] is False and isinstance(summary["written_at"], str)
    assert summary["verdict"] == "leak" and summary["steps"] > 0
    finding = kept_leak(summary)
    assert finding is not None, summary["findings"]
    assert finding["cause"] == "python_objects" and finding["state"] == "leak" and finding["severity"] == "major"
    assert "oom" not in summary  # the memory limit was far away
    assert not says(watched.stderr, "headline")  # no final summary was printed: the kill left no chance

    report = run([sys.executable, "-m", "leakdoctor", "report", path], cwd=tmp_path, timeout=60)
    assert report.returncode == 1, report.stderr  # a leak, as documented, finished or not
    assert says(report.stdout, "incomplete_line", written_at=summary["written_at"]), report.stdout


def test_a_clean_run_is_written_while_it_goes_and_complete_at_its_end(tmp_path):
    path = tmp_path / "leaks.json"
    command = leakdoctor_run("--summary", path, "-o", "heartbeat=0.2", "-o", "oom_watermark=None",
                             "--step-on", "train_step", SCRIPT, "clean", tmp_path)
    watched = Watched(command, cwd=tmp_path)
    try:
        steps: set[int] = set()

        def beats(summary: dict) -> bool:  # incomplete summaries at two different steps: written repeatedly
            assert summary["complete"] is False and isinstance(summary["written_at"], str)
            steps.add(summary["steps"])
            return len(steps) >= 2

        poll(path, watched, beats)
        (tmp_path / "stop").touch()
        assert watched.finish() == 0, watched.stderr
    finally:
        watched.kill()
    summary = json.loads(path.read_text())
    assert summary["complete"] is True and isinstance(summary["written_at"], str)
    # at least the steps the heartbeats had seen (the loop may see the stop file before it runs another step
    # after the last one the test read: on a busy machine it did, at step 193 of 193)
    assert summary["verdict"] == "clean" and summary["steps"] >= max(steps)
    assert summary["settings"]["heartbeat"] == 0.2 and summary["settings"]["oom_watermark"] is None
    report = run([sys.executable, "-m", "leakdoctor", "report", path], cwd=tmp_path, timeout=60)
    assert report.returncode == 0 and not says(report.stdout, "incomplete_line"), report.stdout


def leak_without_heartbeat(path: str) -> dict:
    """A leaking loop with heartbeat=None: was the summary on disk before the end? (In a fresh process:
    in a pytest worker the heap earlier tests freed can take the leak unseen for a long while.)"""
    kept, early = [], False
    with LeakDoctor(summary_path=path, heartbeat=None, oom_watermark=None, warmup=5, window=3, overhead=1.0,
                    verbose=False) as doctor:
        for i in range(120):
            kept.append([float(i)] * 20_000)
            doctor.step()
            early = early or Path(path).exists()
    return {"early": early, "findings": len(doctor.summary.findings)}


def test_without_a_heartbeat_the_summary_is_written_at_the_end_only(tmp_path):
    path = tmp_path / "leaks.json"
    result = isolated(leak_without_heartbeat, str(path))
    assert result["early"] is False and result["findings"] >= 1
    assert json.loads(path.read_text())["complete"] is True


@pytest.mark.filterwarnings("ignore::leakdoctor._base.guard.LeakDoctorWarning")  # the projection to the limit
def test_past_the_watermark_the_post_mortem_is_written_at_once(tmp_path):
    import psutil

    path = tmp_path / "leaks.json"
    limit = psutil.Process().memory_info().rss + 400 * 2**20
    kept = []
    with LeakDoctor(summary_path=path, memory_limit=limit, oom_watermark=0.9, heartbeat=None, warmup=5, window=3,
                    overhead=1.0, verbose=False) as doctor:
        for i in range(200):
            kept.append(bytearray(8 * 2**20))  # touched: resident
            doctor.step()
            if path.exists():
                break
        post_mortem = json.loads(path.read_text())
        assert path.exists() and len(kept) < 100
        oom = post_mortem["oom"]
        assert oom["imminent"] is True and oom["step"] == doctor.steps and oom["limit_bytes"] == limit
        assert oom["limit_source"] == "user" and oom["rss_bytes"] > 0.9 * limit
        assert oom["growing"][0]["metric"] == "rss_bytes"
        assert post_mortem["complete"] is False
        del kept[:]
    final = json.loads(path.read_text())  # the run went on and finished: no out-of-memory, a note of it
    assert final["complete"] is True and "oom" not in final
    assert says(final["notes"], "watermark_passed", step=oom["step"]), final["notes"]


@pytest.mark.filterwarnings("ignore:leakdoctor. summary_path failed")  # the final write fails too, as it should
def test_a_write_that_fails_is_reported_once_and_the_run_goes_on(tmp_path, capsys):
    folder = tmp_path / "out"
    with pytest.warns(LeakDoctorWarning, match="heartbeat") as warned:
        with LeakDoctor(summary_path=folder / "leaks.json", heartbeat=0.01, verbose=False) as doctor:
            shutil.rmtree(folder)  # every write fails from now on
            for _ in range(100):
                time.sleep(0.002)
                doctor.step()
    assert doctor.steps == 100 and not folder.exists()
    assert [e["part"] for e in doctor.summary.errors].count("heartbeat") == 1
    assert sum("heartbeat" in str(w.message) for w in warned) == 1
    assert json.loads(capsys.readouterr().err)["complete"] is True  # the final one went to stderr instead


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "60", True, [60]])
def test_a_bad_heartbeat_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^heartbeat="):
        Settings.create(heartbeat=value)


@pytest.mark.parametrize("value", [0, -0.5, 1.01, float("nan"), "0.95", False])
def test_a_bad_oom_watermark_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^oom_watermark="):
        Settings.create(oom_watermark=value)


def test_the_options_take_none_and_numbers_and_come_through_run_dash_o(capsys):
    assert Settings.create().heartbeat == 60 and Settings.create().oom_watermark == 0.95
    settings = Settings.create(heartbeat=None, oom_watermark=None)
    assert settings.heartbeat is None and settings.oom_watermark is None
    assert Settings.create(heartbeat=0.25, oom_watermark=1).oom_watermark == 1.0
    assert cli(["run", "-o", "heartbeat=0", "no_such_script.py"]) == 2  # refused before anything runs
    assert "heartbeat=0" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:leakdoctor. heartbeat failed")
def test_after_a_failed_write_the_heartbeat_tries_again_and_writes_once_the_disk_is_back(tmp_path):
    """The folder is gone for a moment (a disk full or unmounted): the writes fail, are reported once, and
    once it is back the summary of the run still going is written again, before the run ends."""
    folder = tmp_path / "out"
    path = folder / "leaks.json"
    with LeakDoctor(summary_path=path, heartbeat=0.01, overhead=1.0, verbose=False) as doctor:
        for _ in range(5):
            time.sleep(0.02)
            doctor.step()
        shutil.rmtree(folder)  # every write fails from now on
        # until a write was tried: the next is due a heartbeat after the last, or 1/WRITE_SHARE times that
        # write's time (a loaded machine's write of 20 ms puts the next one a second later)
        deadline = time.monotonic() + 60
        while "heartbeat" not in [e["part"] for e in doctor.summary.errors] and time.monotonic() < deadline:
            time.sleep(0.02)
            doctor.step()
        for _ in range(20):  # and more failed writes, which are not reported again
            time.sleep(0.02)
            doctor.step()
        assert not folder.exists()
        folder.mkdir()  # the disk is back
        deadline = time.monotonic() + 60  # the backoff: 1 s, then 2 s, ... (each at most the heartbeat's)
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
            doctor.step()
        written = json.loads(path.read_text()) if path.exists() else None
        errors = [e["part"] for e in doctor.summary.errors]
    assert written is not None and written["complete"] is False, "the heartbeat stayed off after one failure"
    assert errors.count("heartbeat") == 1, errors  # reported once
    assert json.loads(path.read_text())["complete"] is True  # and the final summary is written there too


def test_the_shortest_heartbeat_takes_a_small_share_of_the_run():
    """heartbeat=0.01 (the shortest allowed) on 1 ms steps: a write costs milliseconds, so writing every
    10 ms took most of the run (heartbeat=1e-300 made one 9x slower); the writes are spread to a share."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        with LeakDoctor(summary_path=Path(folder) / "leaks.json", heartbeat=0.01, overhead=1.0,
                        verbose=False) as doctor:
            start = time.perf_counter()
            for _ in range(1500):
                busy = time.perf_counter()
                while time.perf_counter() - busy < 0.001:
                    pass
                doctor.step()
            wall = time.perf_counter() - start
            beat = doctor._heartbeat
            assert beat.writes >= 2, beat.writes  # it does write while the run goes
            assert beat.seconds / wall < 0.1, (beat.seconds, wall, beat.writes)
