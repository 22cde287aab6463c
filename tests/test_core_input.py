"""Bad input fails at construction with a clear message; failures during the run warn once and never
reach the training loop; the summary is produced whatever happens (to stderr if its path fails)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest
from leakdoctor._base.schema import SCHEMA
from helpers import says

from leakdoctor import LeakDoctor, LeakDoctorWarning
from leakdoctor.integrations import FunctionProbe, Integration, MetricSpec
from leakdoctor._base.evidence import Rule


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"remedies": "bogus"}, "remedies='bogus': expected one of ('off', 'safe', 'all')"),
    ({"remedies": ["gc_collect", "teleport"]}, "unknown remedy name(s) ['teleport']"),
    ({"remedies": 3}, "remedies=3"),
    ({"window": -1}, "window=-1: expected an int >= 1"),
    ({"window": 2.5}, "window=2.5"),
    ({"warmup": True}, "warmup=True"),
    ({"horizon": 0}, "horizon=0"),
    ({"alpha": 0.7}, "alpha=0.7"),
    ({"overhead": 0}, "overhead=0"),
    ({"memory_limit": "lots"}, "memory_limit='lots'"),
    ({"memory_limit": -5}, "memory_limit=-5"),
    ({"verbose": "yes"}, "verbose='yes'"),
    ({"summary_path": 42}, "summary_path=42"),
])
def test_bad_arguments_fail_at_construction_naming_the_value(kwargs, message):
    with pytest.raises(ValueError) as err:
        LeakDoctor(**kwargs)
    assert message in str(err.value)


def test_valid_arguments():
    doctor = LeakDoctor(remedies=["malloc_trim", "gc_collect"], memory_limit="1.5GiB", verbose=False)
    assert doctor.settings.remedies == ("gc_collect", "malloc_trim")  # registry order
    assert doctor.settings.memory_limit == 1.5 * 2**30


def test_summary_path_folder_is_created_or_refused(tmp_path):
    LeakDoctor(summary_path=tmp_path / "new" / "folder" / "leaks.json", verbose=False)
    assert (tmp_path / "new" / "folder").is_dir()
    with pytest.raises(ValueError, match="is a folder"):
        LeakDoctor(summary_path=tmp_path)
    if os.geteuid() == 0:  # root writes through permission bits; sysfs refuses new files to anyone
        unwritable = "/sys/leakdoctor-leaks.json"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        unwritable = str(locked / "leaks.json")
    with pytest.raises(ValueError, match="not writable"):
        LeakDoctor(summary_path=unwritable)


def test_watch_rejects_bad_gauges():
    doctor = LeakDoctor(verbose=False)
    with pytest.raises(ValueError, match="callable"):
        doctor.watch("nodes", 5)
    doctor.watch("nodes", lambda: 1)
    with pytest.raises(ValueError, match="must be a new"):
        doctor.watch("nodes", lambda: 2)
    with pytest.raises(ValueError, match="unit 'litres'"):
        doctor.watch("volume", lambda: 1, unit="litres")
    with pytest.raises(ValueError, match="obj is None"):
        doctor.watch_object(None)


def test_a_gauge_that_raises_warns_once_and_the_run_goes_on(tmp_path):
    calls = {"bad": 0}

    def bad_gauge() -> float:
        calls["bad"] += 1
        raise RuntimeError("gauge broke")

    doctor = LeakDoctor(verbose=False, overhead=1.0, summary_path=tmp_path / "leaks.json")
    doctor.watch("bad", bad_gauge)
    doctor.watch("good", lambda: 7)
    with pytest.warns(LeakDoctorWarning, match="gauge 'bad' failed.*gauge broke") as caught:
        for _ in range(50):
            doctor.step()
    assert len([w for w in caught if "gauge 'bad'" in str(w.message)]) == 1
    assert calls["bad"] == 1
    summary = doctor.finish()
    assert summary.series["good"].end == 7
    assert summary.errors == [{"part": "gauge 'bad'", "error": "RuntimeError: gauge broke"}]
    assert json.loads((tmp_path / "leaks.json").read_text())["errors"][0]["part"] == "gauge 'bad'"


def _probe_failing_after(reads: int) -> Integration:
    count = {"n": 0}

    def read() -> dict[str, float]:
        count["n"] += 1
        if count["n"] > reads:
            raise OSError("device gone")
        return {"widgets": float(count["n"])}

    return Integration("flaky", probes=[FunctionProbe("flaky", read, {"widgets": MetricSpec("widgets", "count")})])


def test_a_probe_or_rule_that_raises_is_switched_off_once():
    def broken_rule(evidence, accepted):
        raise KeyError("no such report")

    part = _probe_failing_after(30)
    part.rules.append(Rule(5, broken_rule))
    doctor = LeakDoctor(verbose=False, overhead=1.0, integrations=[part])
    kept = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(200):
            kept.append(bytearray(300_000))  # a real leak, so an investigation runs the broken rule
            doctor.step()
    summary = doctor.finish()
    parts = sorted(e["part"] for e in summary.errors)
    assert parts == ["probe flaky", "rule broken_rule"]
    failures = [w for w in caught if issubclass(w.category, LeakDoctorWarning) and "failed" in str(w.message)]
    assert len(failures) == 2  # once each (the leak's projection toward the memory limit is warned apart)
    assert summary.series["widgets"].end == 30
    assert [f.cause for f in summary.leaks] == ["python_objects"]  # the other rules still ran


def test_summary_goes_to_stderr_when_its_path_fails_at_the_end(tmp_path, capsys):
    folder = tmp_path / "out"
    doctor = LeakDoctor(summary_path=folder / "leaks.json", verbose=False)
    for _ in range(30):
        doctor.step()
    shutil.rmtree(folder)
    with pytest.warns(LeakDoctorWarning, match="cannot write"):
        summary = doctor.finish()
    printed = json.loads(capsys.readouterr().err)
    assert printed["schema"] == SCHEMA and printed["steps"] == 30 == summary.steps


@pytest.mark.parametrize("stop", [RuntimeError("loss is nan"), KeyboardInterrupt()])
def test_summary_is_written_when_the_loop_raises(tmp_path, stop):
    path = tmp_path / "leaks.json"
    with pytest.raises(type(stop)):
        with LeakDoctor(summary_path=path, verbose=False) as doctor:
            for step in range(100):
                doctor.step()
                if step == 41:
                    raise stop
    data = json.loads(path.read_text())
    assert data["steps"] == 42
    assert says(data["notes"], "ended", error=type(stop).__name__, step=42), data["notes"]


def test_summary_is_written_at_exit_when_finish_is_never_called(tmp_path):
    path = tmp_path / "leaks.json"
    code = ("from leakdoctor import LeakDoctor\n"
            f"doctor = LeakDoctor(summary_path={str(path)!r}, verbose=False)\n"
            "for _ in range(25):\n    doctor.step()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert json.loads(path.read_text())["steps"] == 25


def test_finish_is_idempotent_and_steps_after_it_do_nothing():
    doctor = LeakDoctor(verbose=False)
    for _ in range(10):
        doctor.step()
    first = doctor.finish()
    doctor.step()
    assert doctor.finish() is first and doctor.steps == 10
