"""The leak scenario corpus: every scenario in benchmarks/scenarios/ run for real, each mode in a fresh
process, and leakdoctor scored against its ground truth and against the rules users reach for instead
(benchmarks/comparators.py), on the same loops and the same recorded series.

Per scenario: the detect run (leakdoctor, remedies="off"), then the remedy run where a remedy exists
(remedies="all"), each alone on the machine; then the objgraph run and the tracemalloc run side by side
(their decisions count steps, not seconds, and their costs are measured apart). Then the overhead of
each tool on the same clean loop (benchmarks/scenarios/_overhead.py). Writes the section, a chart
(results/corpus.png) and benchmarks/results.json.

Run: .venv/bin/python benchmarks/run.py corpus      (or bench_corpus.py NAME ... for some scenarios)
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import comparators  # noqa: E402
from common import OUT, machine, table, write_section  # noqa: E402

from leakdoctor.detect import theil_sen  # noqa: E402

ROOT = Path(__file__).parent.parent
SCENARIOS = Path(__file__).parent / "scenarios"
RESULTS = Path(__file__).parent / "results.json"
CHART = OUT / "corpus.png"
HARNESS = SCENARIOS / "_harness.py"
WARMUP = comparators.WARMUP
TIMEOUT = 300
#: Steps after a remedy is applied before the slope after it is measured (two of the doctor's windows).
SETTLE = 12
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


def start(name: str, mode: str, folder: str) -> tuple[subprocess.Popen, Path]:
    out = Path(folder) / f"{name}.{mode}.json"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen([sys.executable, str(HARNESS), name, mode, str(out)], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return process, out


def finish(name: str, mode: str, process: subprocess.Popen, out: Path, began: float) -> dict[str, Any]:
    try:
        _, stderr = process.communicate(timeout=max(1.0, TIMEOUT - (time.monotonic() - began)))
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"scenario": name, "mode": mode, "error": f"timed out after {TIMEOUT} s"}
    if out.exists():
        return json.loads(out.read_text(encoding="utf-8"))
    return {"scenario": name, "mode": mode, "error": f"exit {process.returncode}: {stderr[-2000:]}"}


def run_modes(name: str, modes: list[str], folder: str) -> dict[str, dict[str, Any]]:
    """Run the given modes of one scenario at the same time; their results by mode."""
    began = time.monotonic()
    launched = {mode: start(name, mode, folder) for mode in modes}
    return {mode: finish(name, mode, *launched[mode], began) for mode in modes}


def run_scenario(name: str, folder: str) -> dict[str, dict[str, Any]]:
    began = time.monotonic()
    results = run_modes(name, ["detect"], folder)
    detect = results["detect"]
    if "error" not in detect and detect["truth"]["remedy"]:
        results.update(run_modes(name, ["remedy"], folder))
    results.update(run_modes(name, ["objgraph", "tracemalloc"], folder))
    failed = [f"{mode}: {r['error'].strip().splitlines()[-1]}" for mode, r in results.items() if "error" in r]
    print(f"   {name:28s} {time.monotonic() - began:5.1f} s" + (f"  FAILED {failed}" if failed else ""), flush=True)
    return results


def run_overhead(folder: str) -> dict[str, Any]:
    out = Path(folder) / "overhead.json"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(SCENARIOS / "_overhead.py"), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    if not out.exists():
        return {"error": done.stderr[-2000:]}
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


def stopped_notes(summary: dict[str, Any]) -> list[tuple[str, int]]:
    """(metric, step) of the findings the doctor withdrew at the end: growth that stopped by itself."""
    found = []
    for note in summary.get("notes", []):
        match = re.match(r"(\S+) grew from step \d+ and stopped by itself after step (\d+)", note)
        if match:
            found.append((match.group(1), int(match.group(2))))
    return found


def score_doctor(truth: dict[str, Any], detect: dict[str, Any]) -> dict[str, Any]:
    """What leakdoctor reported in the detect run, against the truth."""
    summary = detect["summary"]
    leaks = [f for f in summary["findings"] if not f["benign"]]
    benign = [f for f in summary["findings"] if f["benign"]]
    step = min((f["detected_step"] for f in leaks), default=None)
    withdrawn = stopped_notes(summary)
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
        location_ok = any(part in (found["location"] or "") for part in truth["location"])
    steps, rss = rss_series(detect)
    since = leak_from(truth)
    rate = slope(steps, rss, since, len(rss)) if truth["leak"] else None
    overhead = summary["overhead"]
    user = overhead.get("step_seconds") or 0.0
    return {
        "alarm": step, "live_alarm": live, "outcome": outcome(truth, step), "live_outcome": outcome(truth, live),
        "latency": step - since if step is not None and step > truth["start"] else None,
        "causes": [f["cause"] for f in leaks], "benign_causes": [f["cause"] for f in benign],
        "cause_ok": cause_ok, "extra": sorted({f["cause"] for f in leaks} - {truth["cause"]}),
        "location": found["location"] if found else None, "location_ok": location_ok,
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
        [f for f in summary["findings"] if not f["benign"]]
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
    steps, rss = rss_series(run)
    result["rss_ratio"] = ratio(steps, rss, since, applied, len(rss))
    points = summary["series"].get(found["metric"], {}).get("points", [])
    if points:
        p_steps, p_values = (np.asarray(v, dtype=float) for v in zip(*points))
        result["metric_ratio"] = ratio(p_steps, p_values, since, applied, run["steps"])
    return result


def ratio(steps: np.ndarray, values: np.ndarray, since: int, applied: int, end: int) -> float | None:
    """Slope after the remedy (from SETTLE steps after it) over the slope before it; None where the
    series did not grow significantly before (its interval reaches zero) or there are too few samples."""
    before = slope(steps, values, since, applied)
    after = slope(steps, values, applied + SETTLE, end)
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
                        "latency": alarm.step - leak_from(truth) if alarm.step and alarm.step > truth["start"] else None}
    return scored


def tool_rows(scenarios: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Recall, false positives and latency per tool over the scored scenarios."""
    tools: dict[str, list[tuple[dict, dict]]] = {LEAKDOCTOR: [], LIVE: [], **{n: [] for n in comparators.RULES}}
    for s in scenarios.values():
        if "doctor" not in s:
            continue
        truth = s["truth"]
        tools[LEAKDOCTOR].append((truth, s["doctor"]))
        tools[LIVE].append((truth, {"outcome": s["doctor"]["live_outcome"], "latency": None}))
        for name in comparators.RULES:
            if not s["rules"][name].get("error"):
                tools[name].append((truth, s["rules"][name]))
    rows = {}
    for name, scored in tools.items():
        leaks = [(t, r) for t, r in scored if t["leak"]]
        benign = [r for t, r in scored if not t["leak"]]
        latencies = [r["latency"] for _, r in leaks if r["outcome"] == "TP" and r.get("latency") is not None]
        fast = [(t, r) for t, r in leaks if (rate := _rate(scenarios, t)) is not None and rate >= FAST_LEAK]
        rows[name] = {
            "detected": sum(r["outcome"] == "TP" for _, r in leaks), "leaks": len(leaks),
            "false_positives": sum(r["outcome"] == "FP" for r in benign), "benign": len(benign),
            "early": sum(r["outcome"] == "early" for _, r in leaks),
            "median_latency": statistics.median(latencies) if latencies else None,
            "fast_within": sum(r["outcome"] == "TP" and r["latency"] is not None and r["latency"] <= TARGET_LATENCY
                               for _, r in fast),
            "fast": len(fast),
        }
    return rows


def _rate(scenarios: dict[str, dict[str, Any]], truth: dict[str, Any]) -> float | None:
    for s in scenarios.values():
        if s["truth"] is truth:
            return s["doctor"]["rate_fraction"]
    return None


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
    return {m: {"error": r["error"]} if "error" in r else
            {"steps": r["steps"], "wall_seconds": round(r["wall_seconds"], 2), "cpu_seconds": round(r["cpu_seconds"], 2)}
            for m, r in results.items()}


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


def remedy_table(scenarios: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, s in scenarios.items():
        if "remedy" not in s:
            continue
        t, r = s["truth"], s["remedy"]
        if "error" in r:
            rows.append([f"`{name}`", t["remedy"], "run failed"] + ["-"] * 5)
            continue
        peaks = s["extra"].get("detect", {}).get("init_peak_bytes"), s["extra"].get("remedy", {}).get("init_peak_bytes")
        if all(peaks):
            rows.append([f"`{name}`", t["remedy"], "applied by the user (a tool for building the model)", "-", "-",
                         "-", f"peak at init {peaks[1] / peaks[0]:.2f}x", "-"])
            continue
        applied = r["remedy"] == t["remedy"]
        shown = (r["remedy"] or "none") + ("" if applied else " (**expected " + t["remedy"] + "**)")
        measured = r["rss_ratio"] if r["rss_ratio"] is not None else r["metric_ratio"]
        ok = None if measured is None else measured < TARGET_RATIO
        rows.append([f"`{name}`", t["remedy"], shown, r["applied_step"] or "-", yes(r["effective"]),
                     percent(r["doctor_ratio"]), f"{percent(r['rss_ratio'])} / {percent(r['metric_ratio'])}",
                     yes(ok if applied else False)])
    return table(["scenario", "expected remedy", "applied", "at step", "verified effective",
                  "rate after / before (doctor)", "slope after / before (measured: RSS / finding's metric)",
                  f"below {TARGET_RATIO:.0%}"], rows)


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
            seconds: float, load: str) -> str:
    leaks = sum(1 for s in scenarios.values() if s["truth"] and s["truth"]["leak"])
    benign = sum(1 for s in scenarios.values() if s["truth"] and not s["truth"]["leak"])
    ld = tools[LEAKDOCTOR]
    doctors = [s["doctor"] for s in scenarios.values() if "doctor" in s]
    wrong_cause = [n for n, s in scenarios.items() if "doctor" in s and s["truth"]["leak"] and not s["doctor"]["cause_ok"]]
    steady = [d["probe_fraction"] for n, d in ((n, s["doctor"]) for n, s in scenarios.items() if "doctor" in s)
              if d["probe_fraction"] is not None]
    remedies = [s["remedy"] for s in scenarios.values() if "remedy" in s and "error" not in s["remedy"]
                and s["remedy"]["remedy"] == s["truth"]["remedy"]]
    expected_remedies = sum(1 for s in scenarios.values() if s["truth"] and s["truth"]["remedy"])
    below = sum(1 for r in remedies if (m := r["rss_ratio"] if r["rss_ratio"] is not None else r["metric_ratio"]) is not None
                and m < TARGET_RATIO)
    targets = [
        ["every leak found, right cause", f"{ld['detected']}/{leaks} found; cause wrong or missing in "
         f"{len(wrong_cause)}" + (f" ({', '.join(wrong_cause)})" if wrong_cause else "")],
        ["nothing raised on a benign scenario", f"{ld['false_positives']}/{benign} false alarms (final summary); "
         f"{tools[LIVE]['false_positives']}/{benign} with live alerts later withdrawn"],
        [f"within {TARGET_LATENCY} steps of a leak of >= {FAST_LEAK:.1%} RSS/step",
         f"{ld['fast_within']}/{ld['fast']}"],
        [f"slope after a remedy < {TARGET_RATIO:.0%} of before", f"{below}/{expected_remedies} scenarios with a remedy"],
        [f"probes < {TARGET_OVERHEAD:.0%} of step time", f"{sum(f < TARGET_OVERHEAD for f in steady)}/{len(steady)} "
         f"runs (median {percent(statistics.median(steady), 2) if steady else '-'})"],
    ]
    return f"""## Leak scenario corpus: leakdoctor against the rules users reach for (issue #7)

`.venv/bin/python benchmarks/run.py corpus` on {machine()}; {seconds / 60:.1f} minutes, load average {load}.
{leaks} leaking and {benign} benign scenarios, one real training loop each (benchmarks/scenarios/, each with its
ground truth in `TRUTH`), across {', '.join(sorted({s['truth']['framework'] for s in scenarios.values() if s['truth']}))}.
Each scenario runs in fresh processes: leakdoctor detect-only (`remedies="off"`), then with remedies
(`remedies="all"`, where a remedy exists), each alone; then objgraph and tracemalloc on the same loop, side by
side. leakdoctor runs with its defaults (warm-up 20, windows of 6 steps, 0.5% sampling budget) and a fixed
`memory_limit="8GiB"` in every scenario; nothing is tuned per scenario. Machine-readable results:
`benchmarks/results.json`; the decision rules: `benchmarks/comparators.py`.

### Targets

{table(["target", "result"], targets)}

### Detection by tool

The series rules (threshold, stormlog) read the resident memory recorded after every step of the detect run,
the series leakdoctor saw; objgraph and tracemalloc looked every {comparators.CHECK} steps in their own run of the
same loop. Every tool ignores the first {WARMUP} steps. "Steps to detect" counts from the leak's first step, or
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
the doctor's recorded series of the finding's metric, from {SETTLE} steps after the remedy to the end, over
the slope from the leak's start to the remedy.

{remedy_table(scenarios)}

### Overhead of each tool on the same loop

{overhead_table(overhead)}

{overhead.get("text", "")}

### Notes

{notes(scenarios)}
"""


def notes(scenarios: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, s in scenarios.items():
        if s.get("error"):
            lines.append(f"- `{name}`: the detect run failed: `{s['error'].strip().splitlines()[-1]}`")
            continue
        t, d = s["truth"], s["doctor"]
        lines.append(f"- `{name}` ({t['framework']}; {t['source']}): {t['what']}." +
                     (f" Findings at: {d['location']}." if d["location"] else "") +
                     (f" Extra causes: {', '.join(d['extra'])}." if d["extra"] else "") +
                     (f" Doctor errors: {d['errors']}." if d["errors"] else "") +
                     "".join(f" {k}: {v}." for m, x in s.get("extra", {}).items() for k, v in x.items()
                             if k != "init_peak_bytes") +
                     "".join(f" {m} run failed: `{r['error'].strip().splitlines()[-1]}`." for m, r in s["runs"].items()
                             if "error" in r))
    return "\n".join(lines)


def main(selected: list[str]) -> int:
    names = scenario_names(selected)
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    print(f"   {len(names)} scenarios", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        raw = {name: run_scenario(name, folder) for name in names}
        print("   overhead of each tool", flush=True)
        overhead = run_overhead(folder)
    scenarios = {name: score(name, results) for name, results in raw.items()}
    tools = tool_rows(scenarios)
    seconds = time.monotonic() - began
    load = f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    RESULTS.write_text(json.dumps({"machine": machine(), "seconds": seconds, "load": load, "tools": tools,
                                   "scenarios": scenarios, "overhead": overhead}, indent=1, default=str) + "\n",
                       encoding="utf-8")
    chart(scenarios, CHART)
    write_section("corpus", section(scenarios, tools, overhead, seconds, load))
    failed = [n for n, s in scenarios.items() if s.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
