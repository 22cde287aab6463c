"""The real-workload corpus (issue #10): public example training scripts of each framework's authors,
reproduced in benchmarks/realworld/ (each file says which and what changed), run as a user runs them.

Per script, in fresh processes: the clean script with leakdoctor at its defaults (three times: the
stability runs, the first also the main table's) and with remedies="safe", and the --leak variant at
the defaults (its planted leak must be found, with the right cause and the user's line). The doctor gets
no memory_limit and nothing tuned: the real defaults, so materiality is judged against this machine's
RAM. Then every benign scenario of benchmarks/scenarios/ three times (bench_corpus's runner, detect mode):
a false alarm is a run whose final summary holds a finding that is not benign. Runs go WORKERS at a time,
the longest first, each with one thread per library (two runs share two cores).

Run: .venv/bin/python benchmarks/run.py realworld     (or bench_realworld.py NAME ... for some scripts)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent / "scenarios")]
import bench_corpus  # noqa: E402
from _harness import marker  # noqa: E402
from common import OUT, machine, table, write_section  # noqa: E402

ROOT = Path(__file__).parent.parent
REALWORLD = Path(__file__).parent / "realworld"
RESULTS = OUT / "realworld.json"
#: Seconds one run may take before it is stopped and reported as failed.
TIMEOUT = 420
WORKERS = bench_corpus.WORKERS
#: Runs of every benign scenario (the clean real-world scripts at the defaults, the corpus's benign ones).
RUNS = 3
#: The stability runs made with on_limit="stop" (issue #12: a clean run is never stopped); the first run
#: is at the real defaults (on_limit="warn").
STOP_RUNS = (2, 3)
RESULT = "realworld-result:"


def leak_lines(path: Path) -> tuple[str, ...]:
    """'name.py:12' for every line of `path` that ends with `# LEAK`: where the user planted the leak."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return tuple(f"{path.name}:{i}" for i, text in enumerate(lines, 1) if text.rstrip().endswith("# LEAK"))


def radam_cond() -> tuple[str, ...]:
    """The old optax RAdam's lax.cond line: where a correct compile_cache finding points for it."""
    from leakdoctor.examples import old_radam

    return (marker(old_radam.__file__, "RADAM-COND"),)


@dataclass(frozen=True)
class Script:
    """A real-workload scenario: a script of benchmarks/realworld/ (with `args`), the public script it
    reproduces, and the truth of its planted leak: the causes a correct diagnosis names and the lines
    (any of them) a correct location contains. `leak_steps`: the --leak run's steps (a leak needs only be
    found; the steps to detect are reported)."""

    file: str
    source: str
    causes: tuple[str, ...]
    leak: str
    args: tuple[str, ...] = ()
    leak_steps: int | None = None
    radam: bool = False

    @property
    def path(self) -> Path:
        return REALWORLD / self.file

    @property
    def where(self) -> tuple[str, ...]:
        return leak_lines(self.path) + (radam_cond() if self.radam else ())


SCRIPTS: dict[str, Script] = {
    "torch_mnist": Script("torch_mnist.py", "pytorch/examples mnist/main.py", ("hook_accumulation",),
                          "a forward hook registered on every batch", leak_steps=400),
    "lightning_autoencoder": Script(
        "lightning_autoencoder.py", "Lightning-AI/pytorch-lightning examples/pytorch/basics/autoencoder.py",
        ("retained_graph", "container_growth"), "training_step_outputs.append(x_hat), never cleared",
        leak_steps=400),
    "keras_convnet_jax": Script("keras_mnist_convnet.py", "keras-team/keras-io examples/vision/mnist_convnet.py",
                                ("python_objects", "container_growth"),
                                "a callback keeps a copy of the weights after every batch",
                                args=("--backend", "jax"), leak_steps=640),
    "keras_convnet_torch": Script("keras_mnist_convnet.py", "keras-team/keras-io examples/vision/mnist_convnet.py",
                                  ("retained_graph",), "a callback keeps the model's predictions of every batch",
                                  args=("--backend", "torch"), leak_steps=320),
    "flax_linen_mnist": Script("flax_linen_mnist.py", "google/flax examples/mnist/train.py", ("compile_cache",),
                               "old optax RAdam applied outside jit (un-jitted lax.cond)", leak_steps=100,
                               radam=True),
    "flax_nnx_mnist": Script("flax_nnx_mnist.py", "google/flax docs_nnx/mnist_tutorial.md", ("device_arrays",),
                             "grad_history.append(grads)", leak_steps=400),
    "equinox_mnist": Script("equinox_mnist.py", "patrick-kidger/equinox examples/mnist.ipynb", ("compile_cache",),
                            "old optax RAdam applied outside filter_jit (un-jitted lax.cond)", leak_steps=100,
                            radam=True),
    "mlx_mnist": Script("mlx_mnist.py", "ml-explore/mlx-examples mnist/main.py", ("lazy_graph",),
                        "mx.eval(model.parameters(), optimizer.state) dropped", leak_steps=400),
}


# --- running ----------------------------------------------------------------------------------------

def child_env() -> dict[str, str]:
    """The corpus's child environment, with one intra-op thread for torch (two runs share two cores; with
    two threads each, torch's CPU kernels spin against each other)."""
    return {**bench_corpus.child_env(), "OMP_NUM_THREADS": "1"}


def command(name: str, doctor: str, leak: bool, summary: Path, steps: int | None = None,
            on_limit: str = "warn") -> list[str]:
    """The command line of one run of a real-workload script; `steps` None: the script's default (the
    scenario's leak_steps for a --leak run)."""
    script = SCRIPTS[name]
    steps = steps or (script.leak_steps if leak else None)
    return [sys.executable, str(script.path), *script.args, "--doctor", doctor, *(["--leak"] if leak else []),
            *(["--steps", str(steps)] if steps else []), "--summary", str(summary), "--on-limit", on_limit]


def on_limit(variant: str) -> str:
    """The doctor's on_limit in a run: "stop" in the STOP_RUNS stability runs, else its default."""
    return "stop" if variant in {f"default-{i}" for i in STOP_RUNS} | {f"run-{i}" for i in STOP_RUNS} else "warn"


def run_script(name: str, variant: str, folder: str, steps: int | None = None) -> dict[str, Any]:
    """One run of a script: variant "default-1".."default-3", "safe" or "leak" (`steps`: see command). Its
    summary, the steps and seconds of its training loop (the script's last line), or an error that says
    why there are none."""
    doctor, leak = ("safe", False) if variant == "safe" else ("default", variant == "leak")
    summary = Path(folder) / f"{name}.{variant}.json"
    began = time.monotonic()
    try:
        done = subprocess.run(command(name, doctor, leak, summary, steps, on_limit(variant)), cwd=ROOT, env=child_env(),
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT} s", "process_seconds": TIMEOUT}
    seconds = time.monotonic() - began
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines or not summary.exists():
        return {"error": f"exit {done.returncode}: {done.stderr[-2000:]}", "process_seconds": seconds}
    loop = json.loads(lines[-1].removeprefix(RESULT))
    return {**loop, "summary": json.loads(summary.read_text(encoding="utf-8")), "process_seconds": seconds}


def run_corpus(name: str, run: int, folder: str) -> dict[str, Any]:
    """One detect run of a benign corpus scenario (bench_corpus's runner, in its own folder)."""
    sub = Path(folder) / f"corpus{run}"
    sub.mkdir(exist_ok=True)
    return bench_corpus.run_mode(name, "detect", str(sub), on_limit(f"run-{run}"))


def benign_corpus() -> list[str]:
    """The benign scenarios of benchmarks/scenarios/ (their TRUTH says leak=False)."""
    return [n for n in bench_corpus.scenario_names([])
            if "leak=False" in (bench_corpus.SCENARIOS / f"{n}.py").read_text(encoding="utf-8")]


def jobs(names: list[str], corpus: list[str]) -> list[tuple[str, str, str]]:
    """(kind, name, variant) of every run, the longest first (by the last run's seconds, if any)."""
    try:
        last = json.loads(RESULTS.read_text(encoding="utf-8"))["seconds"]
    except (OSError, ValueError, KeyError):
        last = {}
    variants = [f"default-{i}" for i in range(1, RUNS + 1)] + ["safe", "leak"]
    queue = [("script", n, v) for n in names for v in variants]
    queue += [("corpus", n, f"run-{i}") for n in corpus for i in range(1, RUNS + 1)]
    return sorted(queue, key=lambda job: -last.get(f"{job[1]}/{job[2]}", 1e9))


def run_all(names: list[str], corpus: list[str], folder: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Every run, WORKERS at a time: results[name][variant]."""
    results: dict[str, dict[str, dict[str, Any]]] = {}

    def one(kind: str, name: str, variant: str) -> dict[str, Any]:
        if kind == "script":
            return run_script(name, variant, folder)
        return run_corpus(name, int(variant.split("-")[1]), folder)

    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {pool.submit(one, *job): job for job in jobs(names, corpus)}
        for future in as_completed(futures):
            kind, name, variant = futures[future]
            result = future.result()
            results.setdefault(name, {})[variant] = result
            failed = f"  FAILED {result['error'].strip().splitlines()[-1]}" if "error" in result else ""
            print(f"   {name:28s} {variant:10s} {result['process_seconds']:6.1f} s{failed}", flush=True)
    return results


# --- scoring ----------------------------------------------------------------------------------------

def leaks(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The findings of a final summary that are not benign."""
    return [f for f in summary["findings"] if bench_corpus.reported(f)]


def describe(finding: dict[str, Any]) -> str:
    """A finding in a few words: cause on metric, rate, and the remedy applied if any."""
    text = f"{finding['cause']} on {finding['metric']} ({finding['rate_per_step']:.3g} {finding['unit']}/step)"
    remedy = finding.get("remedy")
    return text + (f", {remedy['name']} applied" if remedy else "") + (" (benign)" if finding.get("benign") else "")


def score_leak(script: Script, run: dict[str, Any]) -> dict[str, Any]:
    """The --leak run against its truth: found (a leak finding of a right cause), location, latency."""
    if "error" in run:
        return {"error": run["error"]}
    found = [f for f in leaks(run["summary"]) if f["cause"] in script.causes]
    first = min(found, key=lambda f: f["detected_step"]) if found else None
    from leakdoctor._base.messages import location_text  # the summary's {file, line, function, holder} as text

    location = location_text(first["location"]) if first else None
    return {"found": bool(found), "cause": first["cause"] if first else None,
            "causes": [f["cause"] for f in leaks(run["summary"])],
            "location": location, "location_ok": bool(location) and any(w in location for w in script.where),
            "detected_step": first["detected_step"] if first else None,
            "projected_limit_step": run["summary"].get("projected_limit_step"), "steps": run["steps"]}


def score_clean(run: dict[str, Any]) -> dict[str, Any]:
    """A clean run: its verdict, its findings (benign ones too) and the remedies applied."""
    if "error" in run:
        return {"error": run["error"]}
    summary = run["summary"]
    return {"verdict": summary["verdict"], "false_alarm": bool(leaks(summary)),
            "stopped": bool(summary.get("stopped")), "findings": [describe(f) for f in summary["findings"]],
            "details": [{k: f.get(k) for k in ("cause", "metric", "rate_per_step", "unit", "first_step",
                                               "detected_step", "location", "evidence")}
                        for f in summary["findings"]],
            "remedies": [f["remedy"]["name"] for f in summary["findings"] if f.get("remedy")],
            "steps": run["steps"], "step_ms": 1e3 * run["seconds"] / max(1, run["steps"]),
            "process_seconds": run["process_seconds"]}


def score_corpus(run: dict[str, Any]) -> dict[str, Any]:
    """A benign corpus run, scored as bench_corpus scores its detect runs."""
    if "error" in run:
        return {"error": run["error"]}
    doctor = bench_corpus.score_doctor(run["truth"], run)
    summary = run["summary"]
    return {"verdict": summary["verdict"], "false_alarm": doctor["outcome"] == "FP",
            "stopped": bool(summary.get("stopped")), "findings": [describe(f) for f in summary["findings"]],
            "details": [{k: f.get(k) for k in ("cause", "metric", "rate_per_step", "unit", "detected_step",
                                               "location", "evidence")} for f in summary["findings"]]}


# --- reporting --------------------------------------------------------------------------------------

def main_table(names: list[str], scored: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name in names:
        s, script = scored[name], SCRIPTS[name]
        clean, safe, leak = s["default-1"], s["safe"], s["leak"]
        if "error" in clean:
            rows.append([f"`{name}`", script.source, "run failed"] + ["-"] * 10)
            continue
        seen = "; ".join(clean["findings"]) or "none"
        safe_seen = "error" if "error" in safe else ("; ".join(safe["findings"]) or "none")
        applied = "-" if "error" in safe else (", ".join(safe["remedies"]) or "none")
        if "error" in leak:
            planted = ["run failed", "-", "-", "-", "-"]
        else:
            planted = ["yes" if leak["found"] else "**no**", leak["cause"] or ", ".join(leak["causes"]) or "-",
                       f"`{leak['location']}`" + ("" if leak["location_ok"] else " (**not the user's line**)")
                       if leak["location"] else "-",
                       leak["detected_step"] if leak["detected_step"] is not None else "-",
                       f"{leak['projected_limit_step']:.3g}" if leak["projected_limit_step"] else "-"]
        rows.append([f"`{name}`", script.source, clean["steps"], f"{clean['step_ms']:.1f}", verdict(clean),
                     verdict(safe), f"default: {seen}; safe: {safe_seen}", applied, *planted])
    return table(["scenario", "source", "steps", "step time (ms)", "verdict at defaults", "verdict at safe",
                  "findings on clean runs", "remedies applied (safe)", "planted leak found", "cause",
                  "location", "steps to detect", "projected limit step"], rows)


def verdict(run: dict[str, Any]) -> str:
    if "error" in run:
        return "run failed"
    return run["verdict"] if run["verdict"] == "clean" else f"**{run['verdict']}**"


def stability_table(scored: dict[str, dict[str, Any]], names: list[str], corpus: list[str]) -> str:
    rows = []
    for kind, group, prefix in (("real-world", names, "default"), ("corpus", corpus, "run")):
        for name in group:
            runs = [scored[name][f"{prefix}-{i}"] for i in range(1, RUNS + 1)]
            ok = [r for r in runs if "error" not in r]
            alarms = sum(r["false_alarm"] for r in ok)
            seen = Counter(f.split(" (")[0] for r in ok for f in r["findings"])
            shown = ", ".join(f"{what} ({n}/{len(ok)})" for what, n in seen.items()) or "none"
            count = f"{alarms}/{len(ok)}" + (f" ({len(runs) - len(ok)} failed)" if len(ok) < len(runs) else "")
            stops = [r for i, r in enumerate(runs, 1) if i in STOP_RUNS and "error" not in r]
            stopped = f"{sum(r['stopped'] for r in stops)}/{len(stops)}"
            rows.append([f"`{name}`", kind, count if not alarms else f"**{count}**",
                         stopped if stopped.startswith("0/") else f"**{stopped}**", shown])
    return table(["scenario", "kind", "false alarms", "stopped (on_limit='stop' runs)",
                  "findings in the final summaries (runs)"], rows)


def details(scored: dict[str, dict[str, Any]]) -> str:
    """Every finding on a clean run, with its evidence: what the core fixes need."""
    lines = []
    for name, runs in scored.items():
        for variant, run in runs.items():
            if variant == "leak" or "error" in run:
                continue
            for f in run["details"]:
                lines.append(f"- `{name}` {variant}: {f['cause']} on {f['metric']}, {f['rate_per_step']:.3g} "
                             f"{f['unit']}/step, detected at step {f['detected_step']}"
                             f"{', at ' + f['location'] if f.get('location') else ''}: {f['evidence']}")
    return "\n".join(lines) or "None."


def section(names: list[str], corpus: list[str], scored: dict[str, dict[str, Any]], seconds: float,
            load: str) -> str:
    failed = [f"{n} {v}: `{r['error'].strip().splitlines()[-1]}`" for n, runs in scored.items()
              for v, r in runs.items() if "error" in r]
    return f"""## Real-world training scripts: clean runs stay clean, planted leaks are found

`.venv/bin/python benchmarks/run.py realworld` on {machine()}: {seconds / 60:.1f} minutes, load average {load}.

{len(names)} scenarios from public example training scripts of the frameworks' authors, reproduced in
`benchmarks/realworld/` (each file names its source and what changed: synthetic data of the same shapes,
smaller sizes). leakdoctor is attached as a user attaches it (its callback, or `LeakDoctor` and
`doctor.step()`), at its defaults (no `memory_limit`: materiality is judged against this machine's RAM)
and with `remedies="safe"`; the `--leak` variant plants one leak of the kind the framework's users report.
Each run is a fresh process; {WORKERS} at a time, one thread per library. "Step time" is the training loop's
wall time per step (evaluation included) in the first run at the defaults. "Steps to detect" is the step
(for Keras: the fit call) at which the planted leak's finding was made; the --leak runs are shorter
where detection comes early. Raw results: `benchmarks/results/realworld.json`.

{main_table(names, scored)}

Planted leaks: {"; ".join(f"`{n}`: {SCRIPTS[n].leak}" for n in names)}.

### Stability: every benign scenario {RUNS} times

A false alarm is a run whose final summary holds a finding that is not benign (the real-world scripts at
the defaults; the corpus's benign scenarios in bench_corpus's detect mode, with its fixed 8 GiB limit).
Runs {" and ".join(map(str, STOP_RUNS))} of each are made with `on_limit="stop"`: none may be
stopped. Target: 0/{RUNS} false alarms and no stop everywhere.

{stability_table(scored, names, corpus)}

### Findings on clean runs, with their evidence

{details(scored)}
{chr(10) + "Failed runs: " + "; ".join(failed) if failed else ""}
"""


def main(selected: list[str]) -> int:
    unknown = sorted(set(selected) - set(SCRIPTS))
    if unknown:
        raise SystemExit(f"unknown script(s) {unknown}; known: {list(SCRIPTS)}")
    names = [n for n in SCRIPTS if n in selected] if selected else list(SCRIPTS)
    corpus = [] if selected else benign_corpus()
    began, load_before = time.monotonic(), os.getloadavg()[0]
    print(f"   {len(names)} real-world scripts x {RUNS + 2} runs, {len(corpus)} benign corpus scenarios x {RUNS}",
          flush=True)
    with tempfile.TemporaryDirectory() as folder:
        raw = run_all(names, corpus, folder)
    scored = {n: {v: (score_leak(SCRIPTS[n], r) if v == "leak" else score_clean(r)) for v, r in raw[n].items()}
              for n in names}
    scored.update({n: {v: score_corpus(r) for v, r in raw[n].items()} for n in corpus})
    seconds = time.monotonic() - began
    load = f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    if selected:  # a subset: shown here, the section and its results left as they are
        print(main_table(names, scored) + "\n\n" + details(scored))
        return 1 if any("error" in r for runs in scored.values() for r in runs.values()) else 0
    RESULTS.write_text(json.dumps({"machine": machine(), "minutes": round(seconds / 60, 2), "scored": scored,
                                   "seconds": {f"{n}/{v}": r.get("process_seconds", 0.0)
                                               for n, runs in raw.items() for v, r in runs.items()}},
                                  indent=1, default=str) + "\n", encoding="utf-8")
    write_section("realworld", section(names, corpus, scored, seconds, load))
    print(f"   {seconds:.0f} s", flush=True)
    return 1 if any("error" in r for runs in scored.values() for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
