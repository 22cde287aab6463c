"""The corpus benchmark's own machinery, fast and on synthetic inputs: each comparator's decision rule
(benchmarks/comparators.py, stormlog's real analyzer included), the scoring of runs against a ground
truth and the runner's queue (benchmarks/bench_corpus.py), and the harness's recorder and tracemalloc looks
on a tiny loop. The corpus itself is a benchmark (`benchmarks/run.py corpus`), not a test."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path[:0] = [str(BENCHMARKS), str(BENCHMARKS / "scenarios")]

import _harness  # noqa: E402
import bench_corpus  # noqa: E402
import comparators  # noqa: E402

MIB = 2**20


def series(steps: int, level: float = 300 * MIB, growth: float = 0.0, since: int = 0,
           noise: float = 0.0) -> list[float]:
    """RSS after each step: flat at `level`, growing by `growth` bytes a step from step `since` on."""
    rng = np.random.default_rng(0)
    steps_ = np.arange(1, steps + 1)
    values = level + growth * np.maximum(0, steps_ - since) + noise * rng.standard_normal(steps)
    return [float(v) for v in values]


def truth(leak: bool, start: int = 0, **extra: object) -> dict:
    return {"leak": leak, "start": start, "warmup": 20, "check": 10, "settle": 12, "cause": extra.get("cause"),
            "location": extra.get("location", ()), "remedy": extra.get("remedy")}


# --- the series rules --------------------------------------------------------------------------------

def test_threshold_fires_at_the_first_step_above_the_rise_over_the_warmup_level():
    rss = series(200, growth=0.01 * 300 * MIB, since=40)  # 1% of the level per step from step 40
    alarm = comparators.threshold(rss)
    assert alarm.step == 51  # 11% above the level after step 20, the first step past +10%
    assert comparators.threshold(series(200)).step is None


def test_threshold_ignores_the_warmup_but_not_a_single_spike():
    warm = series(19, level=200 * MIB) + series(181)  # grows 50% within the warm-up, then flat
    assert comparators.threshold(warm).step is None
    spiky = series(200)
    spiky[99] *= 1.2
    assert comparators.threshold(spiky).step == 100


def test_online_calls_the_analyzer_every_check_steps_on_the_samples_since_warmup():
    seen = []

    def detect(tracked):
        seen.append(len(tracked.memory_usage))
        return [{"type": "leak", "description": "x"}] if len(tracked.memory_usage) >= 40 else []

    alarm = comparators.online(detect, series(100), warmup=20, every=10)
    assert seen == [10, 20, 30, 40] and alarm.step == 60 and "leak: x" in alarm.detail


def test_stormlog_patterns_flags_monotonic_growth_and_leaves_a_noisy_flat_series():
    assert comparators.stormlog_patterns(series(200, growth=MIB, since=20)).step == 30
    assert comparators.stormlog_patterns(series(200, noise=1e3)).step is None


# --- the look rules ---------------------------------------------------------------------------------

def looks(*grown: list) -> list[dict]:
    return [{"step": 20 + 10 * i, "grown": g} for i, g in enumerate(grown)]


def test_objgraph_rule_needs_the_same_type_at_consecutive_looks():
    baseline = [["dict", 5000], ["list", 3000]]
    assert comparators.objgraph_peaks(looks(baseline, [["Tensor", 10]], [["Tensor", 10]], [["Tensor", 9]])).step == 50
    interrupted = looks(baseline, [["Tensor", 10]], [["dict", 1]], [["Tensor", 10]], [["Tensor", 3]])
    assert comparators.objgraph_peaks(interrupted).step is None
    assert comparators.objgraph_peaks(looks(baseline, *[[["list", 1]]] * 3)).where == "list"


def test_tracemalloc_rule_names_the_line_and_ignores_growth_below_the_floor():
    line = "train.py:42"
    grown = looks([], [[line, 2 * MIB, 10]], [[line, 2 * MIB, 10], ["x.py:1", 100, 1]], [[line, 2 * MIB, 10]])
    alarm = comparators.tracemalloc_lines(grown)
    assert alarm.step == 50 and alarm.where == line
    small = looks([], *[[["lib.py:7", 500, 3]]] * 4)
    assert comparators.tracemalloc_lines(small).step is None


# --- scoring against the truth ------------------------------------------------------------------------

@pytest.mark.parametrize("leak, start, step, expected", [
    (True, 40, 80, "TP"), (True, 40, None, "FN"), (True, 40, 30, "early"), (False, 0, 50, "FP"), (False, 0, None, "TN"),
])
def test_outcome(leak, start, step, expected):
    assert bench_corpus.outcome(truth(leak, start), step) == expected


def finding(cause: str, detected: int, benign: bool = False, location: str | None = None, remedy: dict | None = None,
            metric: str = "rss_bytes", rate: float = 1e6) -> dict:
    return {"cause": cause, "metric": metric, "detected_step": detected, "benign": benign, "location": location,
            "remedy": remedy, "rate_per_step": rate}


def run_result(rss: list[float], findings: list[dict], notes: list[str] = (), points: dict | None = None) -> dict:
    overhead = {"fraction_of_step_time": 0.004, "forensic_seconds": 1.0, "step_seconds": 5.0, "investigations": 1}
    summary = {"findings": findings, "notes": list(notes), "overhead": overhead, "errors": [], "verdict": "leak",
               "series": {m: {"points": p} for m, p in (points or {}).items()}}
    return {"rss": rss, "steps": len(rss), "step_seconds": [0.005] * (len(rss) - 1), "summary": summary}


def test_doctor_scoring_counts_from_the_leak_start_and_checks_cause_and_place():
    t = truth(True, 40, cause="retained_graph", location=("train.py:12",))
    rss = series(200, growth=3 * MIB, since=40)
    found = [finding("native_memory", 70), finding("retained_graph", 85, location="x in run() (train.py:12)")]
    scored = bench_corpus.score_doctor(t, run_result(rss, found))
    assert scored["outcome"] == "TP" and scored["alarm"] == 70 and scored["latency"] == 30
    assert scored["cause_ok"] and scored["location_ok"] and scored["extra"] == ["native_memory"]
    assert scored["rate_fraction"] == pytest.approx(0.01, rel=0.01)  # 3 MiB a step on 300 MiB


def test_doctor_scoring_of_a_benign_run_counts_withdrawn_alerts_as_live_only():
    withdrawn = {**finding("native_memory", 66), "state": "withdrawn", "reason": "stopped by itself"}
    scored = bench_corpus.score_doctor(truth(False), run_result(series(300), [withdrawn]))
    assert scored["outcome"] == "TN" and scored["live_outcome"] == "FP" and scored["live_alarm"] == 66
    assert scored["withdrawn"] == [("rss_bytes", 66)] and scored["cause_ok"]
    benign = bench_corpus.score_doctor(truth(False, cause="allocator_cache"),
                                       run_result(series(300), [finding("allocator_cache", 90, benign=True)]))
    assert benign["outcome"] == "TN" and benign["cause_ok"] and benign["benign_causes"] == ["allocator_cache"]


def test_remedy_scoring_measures_the_slopes_before_and_after_on_the_recorded_series():
    before = series(100, growth=2 * MIB, since=40)
    rss = before + series(100, level=before[-1], growth=0.05 * MIB)  # a twentieth of the growth after step 100
    remedy = {"name": "detach_retained", "applied_step": 100, "effective": True, "rate_after": 0.1 * MIB}
    hooks = [(s, float(min(s, 100) - 40 if s > 40 else 0)) for s in range(1, 201, 3)]
    found = [finding("retained_graph", 95, remedy=remedy, rate=2 * MIB)]
    scored = bench_corpus.score_remedy(truth(True, 40, cause="retained_graph"),
                                       run_result(rss, found, points={"rss_bytes": hooks}))
    assert scored["remedy"] == "detach_retained" and scored["applied_step"] == 100 and scored["effective"]
    assert scored["rss_ratio"] == pytest.approx(0.025, abs=0.005) and scored["doctor_ratio"] == pytest.approx(0.05)
    assert scored["metric_ratio"] == pytest.approx(0.0, abs=1e-9)  # the count stopped at the remedy
    assert bench_corpus.ratio(np.arange(1, 201), np.asarray(series(200)), 40, 100, 200, 12) is None  # nothing grew


def test_remedy_scoring_measures_the_growth_before_up_to_the_investigations_ladders():
    """numpy_gc_cycles: the investigation's gc.collect() rungs (steps 57-65) take the garbage back before
    the remedy is applied, so the growth up to the remedy is a saw; up to the ladders, it is the leak's."""
    rss = series(56, growth=2 * MIB, since=40) + series(144, level=300 * MIB)
    remedy = {"name": "gc_collect", "applied_step": 65, "effective": True, "rate_after": 0.0}
    run = run_result(rss, [finding("python_objects", 65, remedy=remedy, rate=2 * MIB)])
    assert bench_corpus.score_remedy(truth(True, 40, cause="python_objects"), run)["rss_ratio"] is None
    run["summary"]["settings"] = {"investigate_steps": 8}
    scored = bench_corpus.score_remedy(truth(True, 40, cause="python_objects"), run)
    assert scored["rss_ratio"] == pytest.approx(0.0, abs=1e-9)


# --- the harness ----------------------------------------------------------------------------------------

def test_marker_names_the_line_that_carries_the_tag():
    assert _harness.marker(__file__, "TAGGED-LINE") == f"{Path(__file__).name}:{_tagged_line()}"


def _tagged_line() -> int:
    import inspect

    return inspect.currentframe().f_lineno  # TAGGED-LINE


def test_the_stand_in_doctor_keeps_the_loop_unchanged():
    h = _harness.Harness("objgraph", 10)
    stand_in = h.doctor(lambda **kw: pytest.fail("no doctor outside the doctor modes"), tx="optimizer")
    with stand_in as doctor:
        assert doctor.step("state", loss=1.0) == "state" and doctor.tx == "optimizer"
    assert h.callbacks(lambda **kw: None) == [] and h.remedies is None


def test_harness_records_every_step_and_its_tracemalloc_looks_find_a_growing_line():
    h = _harness.Harness("tracemalloc", 60, warmup=20, check=10)
    kept = []
    try:
        for _ in range(60):
            kept.append(bytearray(20_000))  # GROWING
            h.tick()
    finally:
        tracemalloc.stop()
    result = h.result()
    assert result["steps"] == 60 and len(result["rss"]) == 60 and all(v > 0 for v in result["rss"])
    assert [look["step"] for look in result["looks"]] == [20, 30, 40, 50, 60]
    alarm = comparators.tracemalloc_lines(result["looks"])
    assert alarm.step == 50 and alarm.where.endswith(_harness.marker(__file__, "GROWING"))


# --- the runner's queue --------------------------------------------------------------------------------

def test_jobs_start_with_the_longest_and_a_remedy_run_follows_a_detect_run_that_names_a_remedy(monkeypatch, tmp_path):
    seconds = {"slow": {"detect": 30.0, "objgraph": 50.0}, "fast": {"detect": 1.0, "remedy": 2.0}}
    previous = {"scenarios": {name: {"runs": {mode: {"process_seconds": t} for mode, t in runs.items()}}
                              for name, runs in seconds.items()}}
    results = tmp_path / "results.json"
    results.write_text(json.dumps(previous))
    monkeypatch.setattr(bench_corpus, "RESULTS", results)
    monkeypatch.setattr(bench_corpus, "WORKERS", 1)
    calls = []

    def run_mode(name, mode, folder):
        calls.append((name, mode))
        return {"truth": {"remedy": "force_eval" if name == "fast" else None}}

    monkeypatch.setattr(bench_corpus, "run_mode", run_mode)
    raw = bench_corpus.run_all(["fast", "slow"], str(tmp_path))
    # never timed first (fast's objgraph and tracemalloc, slow's tracemalloc), then by the last run's seconds
    assert calls[:3] == [("fast", "objgraph"), ("fast", "tracemalloc"), ("slow", "tracemalloc")]
    assert calls[3:] == [("slow", "objgraph"), ("slow", "detect"), ("fast", "detect"), ("fast", "remedy")]
    assert sorted(raw["fast"]) == ["detect", "objgraph", "remedy", "tracemalloc"]
    assert sorted(raw["slow"]) == ["detect", "objgraph", "tracemalloc"]


def remedied(expected: str | None, applied: str | None, rss_ratio: float | None = None,
             metric_ratio: float | None = None, extra: dict | None = None) -> dict:
    return {"truth": {"remedy": expected}, "extra": extra or {},
            "remedy": {"remedy": applied, "rss_ratio": rss_ratio, "metric_ratio": metric_ratio}}


@pytest.mark.parametrize("scenario, status", [
    (remedied("force_eval", "force_eval", rss_ratio=0.02), "below"),
    (remedied("force_eval", "force_eval", metric_ratio=0.5), "above"),  # the metric's slope where RSS had none
    (remedied("force_eval", "force_eval"), "unmeasured"),
    (remedied("detach_retained", None, rss_ratio=0.0), "not applied"),
    (remedied("low_precision_init", None, extra={"detect": {"init_peak_bytes": 4}, "remedy": {"init_peak_bytes": 1}}),
     "user"),
])
def test_remedy_status(scenario, status):
    assert bench_corpus.remedy_status(scenario) == status
