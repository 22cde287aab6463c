"""SIGTERM (issue 15 item 5): a real signal sent to a real training process. Every doctor writes a complete
summary, the exit status still says SIGTERM, a handler the script installed first is chained, an ignored
SIGTERM stays ignored, and a doctor built in a function that returned is finished too."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from leakdoctor._base.schema import SCHEMA
from helpers import mentions, says
from procs import SCRIPTS, Watched
from leakdoctor._lifecycle import termination


def sigterm_run(tmp_path, *args: str, **env: str) -> tuple[Watched, int]:
    """Start a script, SIGTERM it once it prints "ready", and wait for its end."""
    watched = Watched([sys.executable, *args], cwd=tmp_path, **env)
    watched.wait_for("ready")
    watched.process.send_signal(signal.SIGTERM)
    return watched, watched.finish()


def complete(path) -> dict:
    """The summary at `path`, checked to be a whole summary of a run that SIGTERM ended."""
    summary = json.loads(path.read_text())
    assert summary["schema"] == SCHEMA and summary["verdict"] == "clean"
    assert summary["steps"] >= 80 and summary["series"]["rss_bytes"]["end"] > 0
    assert says(summary["notes"], "ended", error="SIGTERM"), summary["notes"]
    return summary


def test_a_plain_loop_writes_its_summary_and_still_dies_of_sigterm(tmp_path):
    watched, status = sigterm_run(tmp_path, SCRIPTS / "sigterm_loop.py", "plain", tmp_path)
    assert status == -signal.SIGTERM, watched.stderr  # the default action, taken after the summary
    complete(tmp_path / "leaks.json")
    orphan = json.loads((tmp_path / "orphan.json").read_text())  # nobody kept a reference, nobody finished it
    assert orphan["schema"] == SCHEMA and orphan["steps"] == 0
    assert "loop ended" not in watched.stdout
    assert says(watched.stderr, "verdict", verdict="CLEAN")  # the table was printed before the end


def test_a_torch_loop_writes_its_summary(tmp_path):
    watched, status = sigterm_run(tmp_path, SCRIPTS / "sigterm_loop.py", "torch", tmp_path)
    assert status == -signal.SIGTERM, watched.stderr
    summary = complete(tmp_path / "leaks.json")
    assert summary["framework"] == "torch" and "torch_hooks" in summary["series"]


def test_the_scripts_own_handler_is_chained(tmp_path):
    watched, status = sigterm_run(tmp_path, SCRIPTS / "sigterm_loop.py", "chain", tmp_path)
    assert status == 0, watched.stderr  # the script's handler ended the loop, as it would without the doctor
    assert "loop ended" in watched.stdout
    complete(tmp_path / "leaks.json")


def test_an_ignored_sigterm_stays_ignored(tmp_path):
    watched, status = sigterm_run(tmp_path, SCRIPTS / "sigterm_loop.py", "ignore", tmp_path)
    assert status == 0 and "loop ended" in watched.stdout, watched.stderr
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert not any(mentions(note, "SIGTERM") for note in summary["notes"]), summary["notes"]  # no word of it at all


def test_a_keras_fit_writes_the_callbacks_summary(tmp_path):
    watched, status = sigterm_run(tmp_path, SCRIPTS / "sigterm_keras.py", tmp_path, KERAS_BACKEND="torch")
    assert status == -signal.SIGTERM, watched.stderr
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["schema"] == SCHEMA and summary["framework"] == "keras"
    assert says(summary["notes"], "ended", error="SIGTERM"), summary["notes"]
    assert says(summary["notes"], "call_did_not_return", kind="fit"), summary["notes"]


def test_the_handler_is_installed_once_from_the_main_thread_only():
    code = ("import signal, threading; from leakdoctor import LeakDoctor; from leakdoctor._lifecycle import termination\n"
            "t = threading.Thread(target=lambda: LeakDoctor(verbose=False)); t.start(); t.join()\n"
            "print(termination.installed(), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)\n"
            "a = LeakDoctor(verbose=False); handler = signal.getsignal(signal.SIGTERM)\n"
            "b = LeakDoctor(verbose=False); print(termination.installed(), signal.getsignal(signal.SIGTERM) is handler)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=__import__("procs").env())
    assert result.stdout.split() == ["False", "True", "True", "True"], result.stderr


def test_finished_doctors_leave_the_registry():
    from leakdoctor import LeakDoctor

    doctor = LeakDoctor(verbose=False)
    assert id(doctor) in termination._live
    doctor.finish()
    assert id(doctor) not in termination._live
