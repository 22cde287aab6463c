"""The leak scenario corpus: every scenario in benchmarks/scenarios/ run for real, each mode in a fresh
process, and leakdoctor scored against its ground truth and against the rules users reach for instead
(benchmarks/comparators.py), on the same loops and the same recorded series.

Per scenario, three jobs: the detect run (leakdoctor, remedies="off") followed by the remedy run where a
remedy exists (remedies="all"); the objgraph run; the tracemalloc run. The jobs run WORKERS at a time,
the longest first, so the corpus fits in a few minutes on two cores: the decisions scored here count
steps, not seconds, and the doctor's overhead is its own account of its time over the loop's, which a
neighbour slows alike. What each tool costs is measured afterwards, alone on the machine, on one clean
loop (benchmarks/scenarios/_overhead.py). Writes the section, a chart (results/corpus.png) and
benchmarks/results.json.

Run: .venv/bin/python benchmarks/run.py corpus      (or bench_corpus.py NAME ... for some scenarios)
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import comparators  # noqa: E402
from common import OUT, machine, table, write_section  # noqa: E402

from leakdoctor._base.messages import location_text  # noqa: E402
from leakdoctor._base.trend import theil_sen  # noqa: E402

ROOT = Path(__file__).parent.parent
SCENARIOS = Path(__file__).parent / "scenarios"
RESULTS = Path(__file__).parent / "results.json"
CHART = OUT / "corpus.png"
HARNESS = SCENARIOS / "_harness.py"
WARMUP = comparators.WARMUP
#: Seconds one run may take before it is stopped and reported as failed.
TIMEOUT = 150
#: Runs at a time (the machine's two cores), and the jobs of a scenario (see run_job).
WORKERS = 2
JOBS = ("doctor", "objgraph", "tracemalloc")
TARGET_LATENCY = 50
FAST_LEAK = 0.005
TARGET_RATIO = 0.10
TARGET_OVERHEAD = 0.01
LEAKDOCTOR = "leakdoctor"
LIVE = "leakdoctor, live alerts"


# --- running ----------------------------------------------------------------------------------------

def scenario_names(selected: list[str]) -> list[str]:
    names = sorted(p.stem for p in SCENARIOS.glob("*.py") if not p.name.startswith("_"))
    unknown = sorted(set(selected) - set(names))
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {names}")
    return [n for n in names if n in selected] if selected else names


def child_env() -> dict[str, str]:
    """The environment of every child process: one BLAS thread, no buffering, no warnings."""
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}


def run_mode(name: str, mode: str, folder: str, on_limit: str = "warn") -> dict[str, Any]:
    """One scenario in one mode (the doctor's on_limit as given), in a fresh process, stopped after TIMEOUT
    seconds; its result, or an error that says why there is none, with the process's seconds from start
    to exit."""
    out = Path(folder) / f"{name}.{mode}.json"
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, str(HARNESS), name, mode, str(out), on_limit], cwd=ROOT, env=child_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        result = {"scenario": name, "mode": mode, "error": f"timed out after {TIMEOUT} s"}
    else:
        result = json.loads(out.read_text(encoding="utf-8")) if out.exists() else \
            {"scenario": name, "mode": mode, "error": f"exit {process.returncode}: {stderr[-2000:]}"}
    return {**result, "process_seconds": time.monotonic() - began}


def run_job(name: str, kind: str, folder: str) -> dict[str, dict[str, Any]]:
    """A job of the queue, by mode: "doctor" is the detect run, then the remedy run where the truth (which
    the detect run reports) names a remedy; "objgraph" and "tracemalloc" are one run each."""
    began = time.monotonic()
    if kind != "doctor":
        results = {kind: run_mode(name, kind, folder)}
    else:
        results = {"detect": run_mode(name, "detect", folder)}
        if results["detect"].get("truth", {}).get("remedy"):
            results["remedy"] = run_mode(name, "remedy", folder)
    failed = [f"{mode}: {r['error'].strip().splitlines()[-1]}" for mode, r in results.items() if "error" in r]
    print(f"   {name:28s} {kind:12s} {time.monotonic() - began:5.1f} s" + (f"  FAILED {failed}" if failed else ""),
          flush=True)
    return results


def previous_seconds() -> dict[tuple[str, str], float]:
    """Seconds each job took in the last run (benchmarks/results.json), to start the longest first."""
    try:
        scenarios = json.loads(RESULTS.read_text(encoding="utf-8"))["scenarios"]
    except (OSError, ValueError, KeyError):
        return {}
    seconds: dict[tuple[str, str], float] = {}
    for name, s in scenarios.items():
        for mode, run in s.get("runs", {}).items():
            kind = "doctor" if mode in ("detect", "remedy") else mode
            seconds[name, kind] = seconds.get((name, kind), 0.0) + run.get("process_seconds", 0.0)
    return seconds


def run_all(names: list[str], folder: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Every job of every scenario, WORKERS processes at a time, the longest first (by the last run's
    times; a job never timed goes first): each scenario's results by mode."""
    seconds = previous_seconds()
    jobs = sorted(((name, kind) for name in names for kind in JOBS), key=lambda job: -seconds.get(job, math.inf))
    raw: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {pool.submit(run_job, name, kind, folder): name for name, kind in jobs}
        for future in as_completed(futures):
            raw[futures[future]].update(future.result())
    return {name: raw[name] for name in names}


def run_overhead(folder: str) -> dict[str, Any]:
    """benchmarks/scenarios/_overhead.py, alone on the machine: what each tool costs per step."""
    out = Path(folder) / "overhead.json"
    try:
        done = subprocess.run([sys.executable, str(SCENARIOS / "_overhead.py"), str(out)], cwd=ROOT,
                              env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT} s"}
    if not out.exists():
        return {"error": done.stderr[-2000:] or f"exit {done.returncode}"}
    return json.loads(out.read_text(encoding="utf-8"))


# --- scoring ----------------------------------------------------------------------------------------

def slope(steps: np.ndarray, values: np.ndarray, since: float, until: float) -> tuple[float, float, float] | None:
    """Theil-Sen slope (and its 95% interval) of the samples in (since, until]; None if too few."""
    keep = (steps > since) & (steps <= until) & np.isfinite(values)
    if keep.sum() < 6:
        return None
    return theil_sen(steps[keep], values[keep])


def rss_series(result: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    rss = np.asarray(result["rss"], dtype=float)
    return np.arange(1, len(rss) + 1), rss


def outcome(truth: dict[str, Any], step: int | None) -> str:
    """TP (alarm once the leak ran), FN, early (alarm before the leak began), FP (alarm, no leak), TN."""
    if not truth["leak"]:
        return "FP" if step is not None else "TN"
    if step is None:
        return "FN"
    return "TP" if step > truth["start"] else "early"


def leak_from(truth: dict[str, Any]) -> int:
    """The step from which a leak is visible to every tool: its start, or the end of warm-up."""
    return max(truth["start"], truth["warmup"])


def latency(truth: dict[str, Any], step: int | None) -> int | None:
    """Steps from the leak's start (or the end of warm-up) to an alarm raised after the leak began."""
    return step - leak_from(truth) if step is not None and step > truth["start"] else None


def reported(finding: dict[str, Any]) -> bool:
    """A finding the final summary reports as a leak: major or minor, remedied or not (not benign, not
    withdrawn)."""
    return finding.get("state", "benign" if finding["benign"] else "leak") in ("leak", "remedied", "minor")


def withdrawn_alerts(summary: dict[str, Any]) -> list[tuple[str, int]]:
    """(metric, step) of the live alerts the final summary withdrew (growth that stopped by itself, or
    too little to matter with nothing proving a leak)."""
    return [(f["metric"], f["detected_step"]) for f in summary["findings"] if f.get("state") == "withdrawn"]


def score_doctor(truth: dict[str, Any], detect: dict[str, Any]) -> dict[str, Any]:
    """What leakdoctor reported in the detect run, against the truth."""
    summary = detect["summary"]
    leaks = [f for f in summary["findings"] if reported(f)]
    benign = [f for f in summary["findings"] if f["benign"]]
    step = min((f["detected_step"] for f in leaks), default=None)
    withdrawn = withdrawn_alerts(summary)
    live = min([step] * (step is not None) + [s for _, s in withdrawn], default=None)
    pool = leaks if truth["leak"] else benign
    named = [f for f in pool if f["cause"] == truth["cause"]]
    if truth["cause"] is None:
        cause_ok = not leaks
    else:
        cause_ok = bool(named)
    found = named[0] if named else (leaks[0] if leaks else None)
    location_ok = None
    if truth["location"] and found is not None:
        location_ok = any(part in (location_text(found["location"]) or "") for part in truth["location"])
    steps, rss = rss_series(detect)
    since = leak_from(truth)
    rate = slope(steps, rss, since, len(rss)) if truth["leak"] else None
    overhead = summary["overhead"]
    user = overhead.get("step_seconds") or 0.0
    return {
        "alarm": step, "live_alarm": live, "outcome": outcome(truth, step), "live_outcome": outcome(truth, live),
        "latency": latency(truth, step), "live_latency": latency(truth, live),
        "causes": [f["cause"] for f in leaks], "benign_causes": [f["cause"] for f in benign],
        "cause_ok": cause_ok, "extra": sorted({f["cause"] for f in leaks} - {truth["cause"]}),
        "location": location_text(found["location"]) if found else None, "location_ok": location_ok,
        "withdrawn": withdrawn,
        "rate_fraction": rate[0] / rss[since - 1] if rate and len(rss) >= since else None,
        "probe_fraction": overhead.get("fraction_of_step_time"),
        "investigation_seconds": overhead.get("forensic_seconds", 0.0),
        "loop_seconds": user,
        "investigations": overhead.get("investigations", 0),
        "step_ms": 1e3 * float(np.median(detect["step_seconds"])) if detect["step_seconds"] else None,
        "errors": summary.get("errors", []),
    }


def score_remedy(truth: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """What the remedy run did: the expected remedy applied, verified, and the growth after it, measured
    on the recorded RSS (where it grew before) and on the doctor's series of the finding's metric."""
    summary = run["summary"]
    pool = [f for f in summary["findings"] if f["cause"] == truth["cause"]] or \
        [f for f in summary["findings"] if reported(f)]
    found = next((f for f in pool if f["remedy"]), pool[0] if pool else None)
    remedy = found["remedy"] if found else None
    result: dict[str, Any] = {"remedy": remedy["name"] if remedy else None, "applied_step": None,
                              "effective": None, "doctor_ratio": None, "rss_ratio": None, "metric_ratio": None,
                              "verdict": summary["verdict"], "metric": found["metric"] if found else None}
    if remedy is None:
        return result
    applied = remedy["applied_step"]
    result.update(applied_step=applied, effective=remedy["effective"])
    if remedy["rate_after"] is not None and found["rate_per_step"]:
        result["doctor_ratio"] = remedy["rate_after"] / found["rate_per_step"]
    since = leak_from(truth)
    # the growth before: up to the investigation that found it, whose cleanup ladders (a gc.collect()
    # among them) take back some of what grew; from the leak's start to the remedy where that is too short
    ladders = found["detected_step"] - summary.get("settings", {}).get("investigate_steps", 0)
    steps, rss = rss_series(run)
    result["rss_ratio"] = ratio(steps, rss, since, applied, len(rss), truth["settle"], ladders)
    points = summary["series"].get(found["metric"], {}).get("points", [])
    if points:
        p_steps, p_values = (np.asarray(v, dtype=float) for v in zip(*points))
        result["metric_ratio"] = ratio(p_steps, p_values, since, applied, run["steps"], truth["settle"], ladders)
    return result


def ratio(steps: np.ndarray, values: np.ndarray, since: int, applied: int, end: int, settle: int,
          ladders: int | None = None) -> float | None:
    """Slope after the remedy (from `settle` steps after it) over the slope before it, up to the first
    `ladders` step where that leaves enough samples, else up to the remedy; None where the series did not
    grow significantly before (its interval reaches zero) or there are too few samples."""
    before = (slope(steps, values, since, ladders) if ladders is not None and ladders < applied else None) \
        or slope(steps, values, since, applied)
    after = slope(steps, values, applied + settle, end)
    if before is None or after is None or before[1] <= 0:
        return None
    return after[0] / before[0]


def score_rules(truth: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each comparator's alarm on this scenario (None where its run failed)."""
    scored = {}
    for name, (kind, rule) in comparators.RULES.items():
        source = results.get("detect" if kind == "series" else kind, {})
        if "error" in source or not source:
            scored[name] = {"error": True}
            continue
        alarm = rule(source["rss"], truth["warmup"], truth["check"]) if kind == "series" else rule(source["looks"])
        where = alarm.where
        if where and where.startswith(str(ROOT)):
            where = os.path.relpath(where, ROOT)
        location_ok = None
        if kind == "tracemalloc" and truth["location"] and alarm.step is not None:
            location_ok = any(part in (where or "") for part in truth["location"])
        scored[name] = {"alarm": alarm.step, "outcome": outcome(truth, alarm.step), "where": where,
                        "detail": alarm.detail, "location_ok": location_ok,
                        "latency": latency(truth, alarm.step)}
    return scored


def tool_rows(scenarios: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Recall, false positives and latency per tool over the scored scenarios. A leak counts as fast when
    RSS grew by at least FAST_LEAK of itself per step (the detect run's recorded series)."""
    entries: dict[str, list[tuple[dict, float | None, dict]]] = {n: [] for n in (LEAKDOCTOR, LIVE, *comparators.RULES)}
    for s in scenarios.values():
        if "doctor" not in s:
            continue
        truth, doctor = s["truth"], s["doctor"]
        rate = doctor["rate_fraction"]
        entries[LEAKDOCTOR].append((truth, rate, doctor))
        entries[LIVE].append((truth, rate, {"outcome": doctor["live_outcome"], "latency": doctor["live_latency"]}))
        for name in comparators.RULES:
            if not s["rules"][name].get("error"):
                entries[name].append((truth, rate, s["rules"][name]))
    return {name: tool_row(scored) for name, scored in entries.items()}


def tool_row(scored: list[tuple[dict, float | None, dict]]) -> dict[str, Any]:
    """One tool's counts over (truth, leak rate, outcome) entries."""
    leaks = [(rate, r) for t, rate, r in scored if t["leak"]]
    benign = [r for t, _, r in scored if not t["leak"]]
    found = [r for _, r in leaks if r["outcome"] == "TP"]
    latencies = [r["latency"] for r in found if r.get("latency") is not None]
    fast = [r for rate, r in leaks if rate is not None and rate >= FAST_LEAK]
    return {
        "detected": len(found), "leaks": len(leaks),
        "false_positives": sum(r["outcome"] == "FP" for r in benign), "benign": len(benign),
        "early": sum(r["outcome"] == "early" for _, r in leaks),
        "median_latency": statistics.median(latencies) if latencies else None,
        "fast_within": sum(r["outcome"] == "TP" and r.get("latency") is not None and r["latency"] <= TARGET_LATENCY
                           for r in fast),
        "fast": len(fast),
    }


def score(name: str, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    detect = results["detect"]
    if "error" in detect:
        return {"truth": None, "error": detect["error"], "runs": _runs(results)}
    truth = detect["truth"]
    scored: dict[str, Any] = {"truth": truth, "doctor": score_doctor(truth, detect),
                              "rules": score_rules(truth, results), "runs": _runs(results),
                              "extra": {m: r.get("extra", {}) for m, r in results.items() if r.get("extra")}}
    remedy = results.get("remedy")
    if remedy is not None:
        scored["remedy"] = {"error": remedy["error"]} if "error" in remedy else score_remedy(truth, remedy)
    return scored


def _runs(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per mode: steps, seconds of the loop (wall and CPU) and of the whole process, or the error."""
    runs = {}
    for mode, r in results.items():
        run = {"error": r["error"]} if "error" in r else {
            "steps": r["steps"], "wall_seconds": round(r["wall_seconds"], 2), "cpu_seconds": round(r["cpu_seconds"], 2)}
        runs[mode] = {**run, "process_seconds": round(r.get("process_seconds", 0.0), 2)}
    return runs


# --- reporting --------------------------------------------------------------------------------------

def yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "**no**")


def percent(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def doctor_table(scenarios: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, s in scenarios.items():
        if "doctor" not in s:
            rows.append([f"`{name}`", "run failed"] + ["-"] * 9)
            continue
        t, d = s["truth"], s["doctor"]
        expected = f"{'leak' if t['leak'] else 'benign'}: {t['cause'] or 'nothing'}"
        found = ", ".join(d["causes"] + [f"{c} (benign)" for c in d["benign_causes"]]) or "nothing"
        if d["withdrawn"]:
            found += f"; {len(d['withdrawn'])} alert(s) withdrawn"
        verdict = {"TP": "found", "FN": "**missed**", "early": "**alarm before the leak**",
                   "FP": "**false alarm**", "TN": "quiet"}[d["outcome"]]
        if not t["leak"] and t["cause"] and d["outcome"] == "TN":
            verdict = "quiet" if d["cause_ok"] else "quiet, **benign cause not named**"
        latency = d["latency"] if d["latency"] is not None else "-"
        if d["latency"] is not None and d["rate_fraction"] is not None and d["rate_fraction"] >= FAST_LEAK \
                and d["latency"] > TARGET_LATENCY:
            latency = f"**{latency}**"
        rows.append([f"`{name}`", t["framework"], expected, found, verdict, latency,
                     percent(d["rate_fraction"], 2), yes(d["cause_ok"]), yes(d["location_ok"]),
                     percent(d["probe_fraction"], 2),
                     f"{d['investigation_seconds']:.1f} s / {d['loop_seconds']:.1f} s"])
    return table(["scenario", "framework", "truth", "leakdoctor found", "verdict", "steps to detect",
                  "leak, RSS/step", "cause right", "location right", "probe overhead",
                  "investigations / loop"], rows)


def remedy_status(s: dict[str, Any]) -> str:
    """How a scenario with a remedy fared: "user" (a remedy the user applies, judged by its init peak),
    "failed" (the run), "not applied" (not the expected remedy), "unmeasured" (no significant slope before
    it, or too few samples after), "below" or "above" TARGET_RATIO (slope after over before: the recorded
    RSS where it grew significantly, else the doctor's series of the finding's metric)."""
    r = s["remedy"]
    if "error" in r:
        return "failed"
    if init_peaks(s):
        return "user"
    if r["remedy"] != s["truth"]["remedy"]:
        return "not applied"
    measured = r["rss_ratio"] if r["rss_ratio"] is not None else r["metric_ratio"]
    if measured is None:
        return "unmeasured"
    return "below" if measured < TARGET_RATIO else "above"


def init_peaks(s: dict[str, Any]) -> tuple[float, float] | None:
    """Peak memory at initialisation in the detect and the remedy run, where the scenario measured it."""
    peaks = [s["extra"].get(mode, {}).get("init_peak_bytes") for mode in ("detect", "remedy")]
    return (peaks[0], peaks[1]) if all(peaks) else None


def remedy_table(scenarios: dict[str, dict[str, Any]]) -> str:
    """A row per scenario with a remedy: what the remedy run applied, when, and the slopes after/before."""
    rows = []
    for name, s in scenarios.items():
        if "remedy" not in s:
            continue
        t, r, status = s["truth"], s["remedy"], remedy_status(s)
        if status == "failed":
            rows.append([f"`{name}`", t["remedy"], "run failed"] + ["-"] * 5)
        elif status == "user":
            before, after = init_peaks(s)
            rows.append([f"`{name}`", t["remedy"], "applied by the user (a tool for building the model)", "-", "-",
                         "-", f"peak at init {after / before:.2f}x", "-"])
        else:
            shown = (r["remedy"] or "none") + (" (**expected " + t["remedy"] + "**)" if status == "not applied" else "")
            verdict = {"below": "yes", "above": "**no**", "not applied": "**no**", "unmeasured": "-"}[status]
            rows.append([f"`{name}`", t["remedy"], shown, r["applied_step"] or "-", yes(r["effective"]),
                         percent(r["doctor_ratio"]), f"{percent(r['rss_ratio'])} / {percent(r['metric_ratio'])}",
                         verdict])
    return table(["scenario", "expected remedy", "applied", "at step", "verified effective",
                  "rate after / before (doctor)", "slope after / before (measured: RSS / finding's metric)",
                  f"below {TARGET_RATIO:.0%}"], rows)


def target_rows(scenarios: dict[str, dict[str, Any]], tools: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The issue's targets for leakdoctor and how this run met them, naming the scenarios that missed."""
    scored = {n: s for n, s in scenarios.items() if "doctor" in s}
    ld = tools[LEAKDOCTOR]
    wrong = [n for n, s in scored.items() if s["truth"]["leak"] and not s["doctor"]["cause_ok"]]
    alarms = [n for n, s in scored.items() if s["doctor"]["outcome"] == "FP"]
    status = {n: remedy_status(s) for n, s in scored.items() if "remedy" in s}
    judged = [n for n, st in status.items() if st != "user"]
    probes = [s["doctor"]["probe_fraction"] for s in scored.values() if s["doctor"]["probe_fraction"] is not None]

    def named(names: list[str]) -> str:
        return f" ({', '.join(names)})" if names else ""

    missed_remedy = [n for n in judged if status[n] in ("above", "not applied", "failed")]
    unmeasured = [n for n in judged if status[n] == "unmeasured"]
    below = sum(status[n] == "below" for n in judged)
    median = percent(statistics.median(probes), 2) if probes else "-"
    return [
        ["every leak found, right cause", f"{ld['detected']}/{ld['leaks']} found; cause wrong or missing in "
         f"{len(wrong)}{named(wrong)}"],
        ["nothing raised on a benign scenario",
         f"{ld['false_positives']}/{ld['benign']} false alarms{named(alarms)} in the final summary; "
         f"{tools[LIVE]['false_positives']}/{ld['benign']} counting live alerts later withdrawn"],
        [f"within {TARGET_LATENCY} steps of a leak of >= {FAST_LEAK:.1%} RSS/step",
         f"{ld['fast_within']}/{ld['fast']}"],
        [f"slope after a remedy < {TARGET_RATIO:.0%} of before",
         f"{below}/{len(judged)}; missed in {len(missed_remedy)}{named(missed_remedy)}; not measurable in "
         f"{len(unmeasured)}{named(unmeasured)} (see the doctor's own rates below)"],
        [f"probes < {TARGET_OVERHEAD:.0%} of step time (the doctor's own account)",
         f"{sum(f < TARGET_OVERHEAD for f in probes)}/{len(probes)} detect runs (median {median}); per-step cost on "
         f"a clean loop: see the overhead table"],
    ]


def tools_table(rows: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, r in rows.items():
        latency = "-" if r["median_latency"] is None else f"{r['median_latency']:g}"
        lines.append([name, f"{r['detected']}/{r['leaks']}", f"{r['false_positives']}/{r['benign']}", r["early"],
                      latency, f"{r['fast_within']}/{r['fast']}"])
    return table(["tool (decision rule)", "leaks detected", "false alarms on benign", "alarms before a leak began",
                  "median steps to detect", f"fast leaks (>= {FAST_LEAK:.1%} RSS/step) within {TARGET_LATENCY} steps"],
                 lines)


def matrix_table(scenarios: dict[str, dict[str, Any]]) -> str:
    names = list(comparators.RULES)
    rows = []
    for name, s in scenarios.items():
        if "doctor" not in s:
            continue
        cells = [_cell(s["doctor"])] + [_cell(s["rules"][n]) for n in names]
        rows.append([f"`{name}`", "leak" if s["truth"]["leak"] else "benign"] + cells)
    return table(["scenario", "truth", LEAKDOCTOR] + names, rows)


def _cell(r: dict[str, Any]) -> str:
    if r.get("error"):
        return "failed"
    o = r["outcome"]
    if o == "TP":
        return f"{r['latency']} steps"
    return {"FN": "missed", "TN": "-", "FP": f"**FP** @{r['alarm']}", "early": f"**early** @{r['alarm']}"}[o]


def chart(scenarios: dict[str, dict[str, Any]], path: Path) -> None:
    """A matrix of outcomes: scenarios by tool, green found (steps to detect), red missed, orange false
    alarm, grey quiet on a benign scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    tools = [LEAKDOCTOR] + list(comparators.RULES)
    names = [n for n, s in scenarios.items() if "doctor" in s]
    codes = {"TP": 0, "FN": 1, "FP": 2, "early": 2, "TN": 3, "failed": 4}
    grid = np.zeros((len(names), len(tools)))
    fig, ax = plt.subplots(figsize=(1.6 * len(tools) + 3, 0.32 * len(names) + 1.6))
    for i, name in enumerate(names):
        s = scenarios[name]
        for j, tool in enumerate(tools):
            r = s["doctor"] if tool == LEAKDOCTOR else s["rules"][tool]
            o = "failed" if r.get("error") else r["outcome"]
            grid[i, j] = codes[o]
            text = {"TP": str(r.get("latency")), "FN": "missed", "FP": f"FP@{r.get('alarm')}",
                    "early": f"early@{r.get('alarm')}", "TN": "", "failed": "failed"}[o]
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    cmap = ListedColormap(["#8fd18f", "#f08080", "#f5b041", "#e5e5e5", "#bbbbbb"])
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=4, aspect="auto")
    ax.set_xticks(range(len(tools)), [t.replace(" (", "\n(") for t in tools], fontsize=7)
    ax.set_yticks(range(len(names)), [f"{n} ({'leak' if scenarios[n]['truth']['leak'] else 'benign'})"
                                      for n in names], fontsize=7)
    ax.xaxis.tick_top()
    ax.set_title("steps from leak start to alarm (green), missed (red), false alarm (orange), quiet (grey)",
                 fontsize=8, pad=28)
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def overhead_table(overhead: dict[str, Any]) -> str:
    if "error" in overhead:
        return f"The overhead run failed: `{overhead['error'].strip().splitlines()[-1]}`"
    rows = [[r["loop"], r["tool"], f"{r['ratio']:.3f}", f"{r['low']:.3f}-{r['high']:.3f}", r.get("note", "")]
            for r in overhead["rows"]]
    return table(["loop", "tool", "CPU time per step, tool / none (median of pairs)", "range of pairs",
                  "note"], rows)


def section(scenarios: dict[str, dict[str, Any]], tools: dict[str, Any], overhead: dict[str, Any],
            seconds: float, cpu: float, load: str) -> str:
    """The corpus's section of BENCHMARKS.md."""
    leaks = sum(1 for s in scenarios.values() if s["truth"] and s["truth"]["leak"])
    benign = sum(1 for s in scenarios.values() if s["truth"] and not s["truth"]["leak"])
    frameworks = ", ".join(sorted({s["truth"]["framework"] for s in scenarios.values() if s["truth"]}))
    return f"""## Leak scenario corpus: leakdoctor against the rules users reach for

`.venv/bin/python benchmarks/run.py corpus` on {machine()}: {seconds / 60:.1f} minutes
({cpu:.0f} CPU seconds in the child processes), load average {load}.

{leaks} leaking and {benign} benign scenarios, one real training loop each (benchmarks/scenarios/, each with
its ground truth in `TRUTH`), across {frameworks}.
Each scenario runs in fresh processes: leakdoctor detect-only (`remedies="off"`), then with remedies
(`remedies="all"`, where a remedy exists); objgraph and tracemalloc each in a run of their own on the same
loop. Runs go {WORKERS} at a time (the decisions count steps, not seconds); the overhead of each tool is
measured afterwards, alone on the machine. leakdoctor runs with its defaults (warm-up 20 steps, windows of
6, a 0.5% sampling budget) and a fixed `memory_limit="8GiB"` in every scenario, plus what a user passes
anyway (the model and optimizer, `doctor.step(state)` for Flax, a gauge for a graph); nothing is tuned per
scenario. Machine-readable results: `benchmarks/results.json`; the decision rules: `benchmarks/comparators.py`.

### Targets

{table(["target", "result"], target_rows(scenarios, tools))}

### Detection by tool

The series rules (threshold, stormlog) read the resident memory recorded after every step of the detect run,
the series leakdoctor saw; objgraph and tracemalloc looked every {comparators.CHECK} steps in their own run of the
same loop, and stormlog's analyzers were called as often. Every tool ignores the first {WARMUP} steps. In the
Keras scenarios a step is a fit() or predict() call: the warm-up is 3 calls (the Keras callback's) and the
looks come every other call. "Steps to detect" counts from the leak's first step, or
from the end of the warm-up for a leak that runs from the start. leakdoctor's verdict is its final summary;
"live alerts" also counts findings it printed during the run and withdrew at the end (growth that stopped).

{tools_table(tools)}

![outcomes by scenario and tool](benchmarks/results/corpus.png)

{matrix_table(scenarios)}

### leakdoctor per scenario (detect-only run)

"leak, RSS/step": the Theil-Sen slope of RSS from the leak's start, as a fraction of RSS then (growth of other
resources, hooks or compiles, can be small in RSS). "probe overhead": the doctor's own account (time in
`step()`, investigations excluded) over loop time; "investigations": seconds spent in its bounded forensic
windows, against the loop's seconds (in a run of a few hundred steps they weigh far more than in a real run).

{doctor_table(scenarios)}

### Remedies (`remedies="all"` run)

The doctor's verdict compares the slope of the finding's metric after the remedy with before; the measured
columns are the Theil-Sen slope of this harness's own RSS record (where RSS grew significantly before) and of
the doctor's recorded series of the finding's metric, from two of the doctor's windows after the remedy (12
steps; 2 calls for Keras) to the end, over
the slope from the leak's start to the remedy.

{remedy_table(scenarios)}

### Overhead of each tool on the same loop

{overhead_table(overhead)}

{overhead.get("text", "")}

### Notes

{notes(scenarios)}
"""


def notes(scenarios: dict[str, dict[str, Any]]) -> str:
    """A line per scenario: what it is, where leakdoctor pointed, and what its loop reported."""
    lines = []
    for name, s in scenarios.items():
        if s.get("error"):
            lines.append(f"- `{name}`: the detect run failed: `{s['error'].strip().splitlines()[-1]}`")
            continue
        t, d = s["truth"], s["doctor"]
        lines.append(f"- `{name}` ({t['framework']}; {t['source']}): {t['what']}." +
                     (f" Findings at: {d['location']}." if d["location"] else "") +
                     (f" Extra causes: {', '.join(d['extra'])}." if d["extra"] else "") +
                     (f" Doctor errors: {d['errors']}." if d["errors"] else "") + loop_report(s) +
                     "".join(f" {m} run failed: `{r['error'].strip().splitlines()[-1]}`." for m, r in s["runs"].items()
                             if "error" in r))
    return "\n".join(lines)


def loop_report(scenario: dict[str, Any]) -> str:
    """What the scenario's loop returned (final loss, cache sizes) in its detect and remedy runs."""
    parts = []
    for mode in ("detect", "remedy"):
        extra = scenario.get("extra", {}).get(mode, {})
        shown = ", ".join(f"{key} {value}" for key, value in extra.items() if key != "init_peak_bytes")
        if shown:
            parts.append(f" {mode} run: {shown}.")
    return "".join(parts)


def children_cpu_seconds() -> float:
    """User and system CPU seconds of every child process that has ended so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(selected: list[str]) -> int:
    names = scenario_names(selected)
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    print(f"   {len(names)} scenarios", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        raw = run_all(names, folder)
        print("   overhead of each tool (alone)", flush=True)
        overhead = run_overhead(folder)
    scenarios = {name: score(name, results) for name, results in raw.items()}
    tools = tool_rows(scenarios)
    seconds, cpu = time.monotonic() - began, children_cpu_seconds()
    load = f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    RESULTS.write_text(json.dumps({"machine": machine(), "seconds": seconds, "cpu_seconds": cpu, "load": load,
                                   "tools": tools, "scenarios": scenarios, "overhead": overhead},
                                  indent=1, default=str) + "\n", encoding="utf-8")
    chart(scenarios, CHART)
    write_section("corpus", section(scenarios, tools, overhead, seconds, cpu, load))
    print(f"   {len(names)} scenarios and the overhead run: {seconds:.0f} s, {cpu:.0f} CPU seconds", flush=True)
    return 1 if any(s.get("error") for s in scenarios.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
