"""Escalation on evidence (issue #36): a suspicion of resident memory is confirmed on cheap counters
(malloc's bytes in use, the bytes Python's objects use) before any investigation, so growth that keeps
nothing costs a triage of microseconds to milliseconds instead of forensics of a second; and what waits for
the budget is listed, unless it would reach the memory limit first. The loops are real (numpy, the C heap,
Python objects); the budget decisions are fed by hand, as test_clinic's are."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from helpers import place
from test_clinic import MIB, clinic_reading, feed

from leakdoctor import LeakDoctor
from leakdoctor.integrations import MetricSpec
from leakdoctor._base.trend import Trend
from leakdoctor._judging.triage import Triage, corroborators

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2 and CPython's arena stats")


def run(plant: str, steps: int = 300) -> dict:
    """A numpy loop with one planted behaviour, under a doctor that samples every step."""
    touched = np.empty(60_000_000 // 8)  # 60 MB mapped and never written until the loop touches it
    kept: list = []
    width = 100_000 // 8
    with LeakDoctor(verbose=False, overhead=1.0) as doctor:
        for step in range(steps):
            np.random.default_rng(step).random((64, 64)) @ np.ones((64, 64))
            if plant == "touch":  # resident memory grows into pages mapped already: nothing is allocated
                touched[step * width:(step + 1) * width] = 1.0
            elif plant == "arrays":
                kept.append(np.ones(25_000))  # KEPT-ARRAYS
            elif plant == "objects":
                kept.append([{"step": step, "i": i} for i in range(400)])  # KEPT-OBJECTS
            doctor.step()
    return doctor.summary.to_dict()


@linux
def test_resident_memory_that_grows_into_mapped_pages_is_triaged_and_never_investigated():
    summary = run("touch")
    overhead = summary["overhead"]
    assert summary["verdict"] == "clean" and summary["findings"] == []
    assert overhead["investigations"] == 0, overhead
    assert overhead["suspicions_triaged"] >= 1 and overhead["suspicions_dismissed"]["rss_bytes"] >= 1, overhead


@linux
def test_a_summary_with_dismissed_and_deferred_suspicions_is_read_back(tmp_path):
    """The triage's counts and what waited for the budget are records in `overhead`: `leakdoctor report`
    (Summary.load) reads them back."""
    from leakdoctor import Summary

    summary = run("touch")
    # the records as a run writes them, whatever this run's triage did (under a loaded test run, its
    # suspicions once all ended undismissed: what a run dismisses is the test above's to check)
    summary["overhead"]["suspicions_dismissed"] = {"rss_bytes": 2}
    summary["overhead"]["deferred"] = [{"step": 90, "metrics": ["rss_bytes"], "why": "budget"}]
    path = tmp_path / "leaks.json"
    path.write_text(json.dumps(summary))
    loaded = Summary.load(path)
    assert loaded.overhead["suspicions_dismissed"] == {"rss_bytes": 2}
    assert loaded.overhead["deferred"][0]["step"] == 90


@linux
@pytest.mark.parametrize("plant, marker", [("arrays", "KEPT-ARRAYS"), ("objects", "KEPT-OBJECTS")])
def test_a_growth_that_keeps_memory_is_confirmed_and_named_at_its_line(plant, marker):
    """Arrays kept show in malloc's bytes in use, small Python objects in the bytes of Python's arenas:
    either confirms the suspicion, and the investigation names the leak where it is kept."""
    summary = run(plant)
    line = next(i for i, text in enumerate(open(__file__, encoding="utf-8"), 1) if f"# {marker}" in text)
    assert summary["verdict"] == "leak", summary["findings"]
    assert summary["overhead"]["suspicions_triaged"] >= 1 and summary["overhead"]["investigations"] >= 1
    assert any(f["metric"] == "rss_bytes" and place(f) and place(f).endswith(f"test_escalation.py:{line}")
               for f in summary["findings"]), summary["findings"]


def test_a_counter_confirms_only_a_steady_rise_and_a_metric_without_counters_goes_straight_on():
    specs = {"rss": MetricSpec("rss", confirmed_by=("heap",)), "heap": MetricSpec("heap"),
             "hooks": MetricSpec("hooks", "count")}
    trend = Trend("growing", slope=100.0)
    assert corroborators({"rss": trend}, specs.__getitem__) == {"heap"}
    assert corroborators({"rss": trend, "hooks": trend}, specs.__getitem__) is None

    def judged(heap: list[float]) -> tuple | None:
        triage = Triage({"rss": trend}, start=0, window=6)
        for step, value in enumerate(heap):
            triage.add(step, {"heap": value})
        return triage.judge(len(heap) - 1, specs.__getitem__, lambda metric: 1e9, 100_000)

    rising = judged([100.0 * step for step in range(13)])
    assert rising is not None and list(rising[0]) == ["rss"]
    jump_given_back = judged([0.0] * 7 + [5000.0] * 3 + [0.0] * 3)  # transients fall out of the minima
    assert jump_given_back is not None and list(jump_given_back[1]) == ["rss"]
    assert judged([5.0 * step for step in range(13)]) is None  # grew, not yet a tenth of the rate: read on
    early = judged([100.0 * step for step in range(7)])  # a fast rise is confirmed at the first window's end
    assert early is not None and list(early[0]) == ["rss"]
    assert judged([0.0] * 7) is None  # a dismissal waits for the second window


def test_an_investigation_over_the_budget_waits_and_is_listed_with_its_step():
    clinic, now = clinic_reading(readings := lambda step: {"a": 100 * MIB + step * MIB})
    clinic.forensic_budget = 0.0
    clinic.investigations, clinic.forensic_seconds = 1, 1.0
    clinic._investigated["a"] = float("inf")  # investigated before, and a leak found still grows
    feed(clinic, now, readings, steps=120)
    assert clinic.investigations == 1 and clinic.deferred >= 1
    assert clinic.deferred_at[0]["metrics"] == ["a"] and clinic.deferred_at[0]["why"] == "budget"
    assert clinic.deferred_at[0]["step"] >= 57


def test_a_suspect_that_would_reach_its_limit_before_the_budget_allows_is_investigated_at_once():
    clinic, _ = clinic_reading(lambda step: {})
    clinic.forensic_budget, clinic._step_seconds = 0.01, 0.001
    clinic.investigations, clinic.forensic_seconds = 1, 1.0
    for step in range(1, 61):
        clinic.monitor.record(step, {"a": 900 * MIB}, lambda metric: MetricSpec(metric, limit=1000 * MIB))
    clinic._investigated["a"] = float("inf")
    near = {"a": Trend("growing", slope=MIB)}  # 100 steps from the limit; the budget needs 100,000
    far = {"a": Trend("growing", slope=1.0)}
    assert not clinic._over_budget(near, run_seconds=1.0)
    assert clinic._over_budget(far, run_seconds=1.0)
