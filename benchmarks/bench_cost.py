"""What a clean run pays (issue #36): each unedited textbook script (benchmarks/textbook/, the published
examples, with their own default arguments: the Keras example fits one model, without the textbook table's
dropout search) run as `python script.py` and as `python -m leakdoctor run script.py`, alternately (which goes
first alternates too), PAIRS pairs, one run at a time, each a fresh process timed from outside (whole-process
wall time, imports and the doctor's start included). Per script: the median ratio with-doctor / plain and its
spread, the doctor's own overhead line beside it (its printed total, and the investigations it made), and
the triage's count of suspicions checked on cheap counters. The ratio is the user's figure; the doctor's own
line is what it can see of itself (not the interpreter's start, the imports of leakdoctor, the heap walk that
finds the model).

Run: .venv/bin/python benchmarks/run.py cost          (all 8 scripts; writes the section)
     .venv/bin/python benchmarks/bench_cost.py NAME ... [--pairs N]   (some scripts, printed and written)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_textbook  # noqa: E402
from common import OUT, machine, table, write_section  # noqa: E402

PAIRS = 3  # `--pairs N` to change
RESULTS = OUT / "cost.json"


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int]:
    began = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=bench_textbook.TIMEOUT)
    return time.monotonic() - began, done.returncode


def measure(name: str, pairs: int) -> dict[str, Any]:
    """PAIRS alternating pairs of one script, plain and under the doctor; the doctor's summaries read back."""
    script = bench_textbook.SCRIPTS[name]
    # as a user's Python runs: it caches the modules it compiles (this machine's shells set
    # PYTHONDONTWRITEBYTECODE, which would charge leakdoctor's editable source a compile on every start)
    env = {k: v for k, v in bench_textbook.child_env(script.env).items() if k != "PYTHONDONTWRITEBYTECODE"}
    plain, doctor, summaries = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for i in range(pairs):
            summary = Path(folder) / f"s{i}.json"
            runs = [("plain", [sys.executable, str(script.path)]),
                    ("doctor", [sys.executable, "-m", "leakdoctor", "run", "--summary", str(summary),
                                str(script.path)])]
            for kind, command in (runs if i % 2 == 0 else runs[::-1]):
                seconds, code = timed(command, env, Path(folder))
                if code:
                    raise RuntimeError(f"{name} {kind} exited {code}")
                (plain if kind == "plain" else doctor).append(seconds)
            summaries.append(json.loads(summary.read_text()))
    ratios = [d / p for p, d in zip(plain, doctor)]
    own = [s["overhead"].get("fraction_of_run_time", 0.0) for s in summaries]
    return {"plain": plain, "doctor": doctor, "ratios": ratios, "own": own,
            "verdicts": [s["verdict"] for s in summaries],
            "findings": [[{k: f.get(k) for k in ("cause", "metric", "severity", "state", "location", "rate_per_step")}
                          for f in s["findings"]] for s in summaries],
            "investigations": [s["overhead"].get("investigations", 0) for s in summaries],
            "triaged": [s["overhead"].get("suspicions_triaged", 0) for s in summaries]}


def section(results: dict[str, dict[str, Any]], pairs: int, minutes: float) -> str:
    rows = []
    for name, r in results.items():
        ratio = statistics.median(r["ratios"])
        rows.append([name, f"{statistics.median(r['plain']):.1f} s", f"**{ratio:.3f}**",
                     f"{min(r['ratios']):.3f}-{max(r['ratios']):.3f}", f"{statistics.median(r['own']):.2%}",
                     f"{statistics.mean(r['investigations']):.1f}", f"{statistics.mean(r['triaged']):.1f}",
                     " ".join(sorted(set(r["verdicts"])))])
    return "\n".join([
        "## Cost on real scripts", "",
        f"Each unedited textbook script run as `python script.py` and as `python -m leakdoctor run script.py`, "
        f"alternately, {pairs} pairs, one process at a time, whole-process wall time measured outside the doctor, "
        "Python caching compiled modules as it does by default "
        f"(`.venv/bin/python benchmarks/run.py cost`, {minutes:.0f} min, {machine()}). Ratio: with the doctor / "
        "plain, the median of the pairs and their range. Own line: the doctor's printed total (its step(), "
        "sampler thread and investigations over the run's time); it leaves out what happens before the first "
        "step (the interpreter, leakdoctor's imports, finding the model). Triaged: suspicions checked on cheap "
        "counters (malloc's bytes in use, Python's bytes, the workers' new memory, the live arrays' bytes) "
        "before any investigation.", "",
        table(["script", "plain (median)", "ratio", "range", "own line", "investigations / run",
               "triaged / run", "verdicts"], rows)])


def main(argv: list[str]) -> None:
    pairs = PAIRS
    if "--pairs" in argv:
        at = argv.index("--pairs")
        pairs, argv = int(argv[at + 1]), argv[:at] + argv[at + 2:]
    names = argv or list(bench_textbook.SCRIPTS)
    began = time.monotonic()
    results = {}
    for name in names:
        results[name] = measure(name, pairs)
        r = results[name]
        print(name, f"ratio {statistics.median(r['ratios']):.3f} ({min(r['ratios']):.3f}-{max(r['ratios']):.3f})",
              f"own {statistics.median(r['own']):.2%}", "investigations", r["investigations"],
              "triaged", r["triaged"], r["verdicts"], flush=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    write_section("02_cost", section(results, pairs, (time.monotonic() - began) / 60))


if __name__ == "__main__":
    main(sys.argv[1:])
