"""What the always-on doctor costs, measured from outside `doctor.step()`, and what that buys.

1. Cost of one sample, every step sampled (`overhead=1.0`), in a process that loaded each framework and
   the doctor's integration for it (plain Python, torch, JAX/Flax, Keras, MLX): the time of each
   `doctor.step()` call, timed by the caller around the call, median and 90th percentile.
2. At the defaults (0.5% budget), for steps of 1, 5 and 20 ms: the time inside `doctor.step()` over the
   user's time between calls (both timed by the caller in the same loop), against the doctor's own
   account (`summary.overhead`), and the sampling stride the budget chose.
3. Detection latency at the defaults: a leak of 0.5% of RSS per step starts at step LEAK_START (the
   pacer still learning what a sample costs: it widens its stride at most twofold at a time) or after
   SETTLED_SECONDS of steps (the stride the budget settled on); steps from its start to the finding,
   against what the summary says the budget bought (`overhead["latency_steps"]`).
4. The machine's floor: an empty call, a sample's bare minimum (one pread of /proc/self/statm, the
   process's CPU clock, three appends to a list), an RSS-only sample and one sample of the doctor (plain
   Python), each after 1, 5 and 20 ms of other work, in this thread's CPU time. What a few microseconds
   of work cost depends on how long the caches and the TLB have been someone else's.

Each measurement runs in a fresh subprocess (`python benchmarks/bench_overhead.py KIND ...` runs one),
so no framework's imports or threads touch another's figures. Steps are busy waits on the clock, so the
step time is what it says on the tin whatever the machine's load.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, table, write_section  # noqa: E402

SAMPLES = 3000
STEP_MS = (1, 5, 20)
RUN_SECONDS = 12
LEAK_START = 120
SETTLED_SECONDS = 3.0
LEAK_SHARE = 0.005
LATENCY_STEPS = 400
FLOOR_GAPS_MS = (1, 5, 20)
FLOOR_SAMPLES = 200


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def doctor_for(kind: str, **options: Any) -> Any:
    """A doctor with the integrations a user of `kind` gets, over a small real model."""
    options = {"verbose": False, **options}
    if kind == "python":
        from leakdoctor import LeakDoctor
        return LeakDoctor(**options)
    if kind == "torch":
        import torch
        from leakdoctor.callbacks.torch import LeakDoctor
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        return LeakDoctor(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **options)
    if kind == "jax":
        import jax.numpy as jnp
        from leakdoctor.callbacks.flax import LeakDoctor
        doctor = LeakDoctor(**options)
        doctor.kept = jnp.ones((256, 256))  # a live array, as a training loop holds
        return doctor
    if kind == "keras":
        import os
        os.environ.setdefault("KERAS_BACKEND", "jax")
        import keras
        from leakdoctor.callbacks.keras import KerasDoctor
        from leakdoctor.integrations.keras import Calls
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(10)])
        return KerasDoctor(Calls(), "bench", model=model, **options)
    if kind == "mlx":
        import mlx.nn as nn
        import mlx.optimizers as optim
        from leakdoctor.callbacks.mlx import LeakDoctor
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        return LeakDoctor(model=model, optimizer=optim.SGD(0.1), **options)
    raise ValueError(kind)


def timed_loop(doctor: Any, steps: int, step_seconds: float, work: Callable[[int], None] = lambda i: None
               ) -> tuple[list[float], float]:
    """Run `steps` busy steps; return the duration of each doctor.step() call and the user's seconds."""
    inside, user = [], 0.0
    for i in range(steps):
        start = time.perf_counter()
        busy(step_seconds)
        work(i)
        mid = time.perf_counter()
        doctor.step()
        inside.append(time.perf_counter() - mid)
        user += mid - start
    return inside, user


def sample_cost(kind: str) -> dict[str, Any]:
    doctor = doctor_for(kind, overhead=1.0)
    inside, _ = timed_loop(doctor, SAMPLES, 0.001)
    summary = doctor.finish()
    kept = sorted(inside[100:])
    return {"median_us": 1e6 * statistics.median(kept), "p90_us": 1e6 * kept[int(0.9 * len(kept))],
            "stride": summary.settings["sample_stride"], "findings": len(summary.findings)}


def fraction(kind: str, step_ms: float) -> dict[str, Any]:
    doctor = doctor_for(kind)
    steps = int(RUN_SECONDS / (step_ms / 1e3))
    inside, user = timed_loop(doctor, steps, step_ms / 1e3)
    summary = doctor.finish()
    overhead = summary.overhead
    forensic = overhead["forensic_seconds"]
    return {"step_ms": step_ms, "steps": steps, "outside": (sum(inside) - forensic) / user,
            "own": overhead["fraction_of_step_time"], "forensic_s": forensic,
            "investigations": overhead["investigations"], "stride": summary.settings["sample_stride"],
            "latency": overhead.get("latency_steps"), "findings": len(summary.findings)}


def latency(step_ms: float, settled: bool) -> dict[str, Any]:
    """Steps from the start of a 0.5%-of-RSS-per-step leak to the doctor's finding, the leak starting at
    LEAK_START or once the pacer settled; the stride and the summary's latency just before it starts."""
    from leakdoctor.integrations.process import RssReader

    doctor = doctor_for("python")
    kept: list[bytearray] = []
    size = int(LEAK_SHARE * RssReader()())
    start = max(LEAK_START, int(SETTLED_SECONDS / (step_ms / 1e3))) if settled else LEAK_START
    before: dict[str, Any] = {}

    def leak(i: int) -> None:
        if i == start:
            overhead = doctor.summary.overhead
            before.update(stride=overhead["sample_stride"], promised=overhead["latency_steps"])
        if i >= start:
            kept.append(bytearray(b"x" * size))

    timed_loop(doctor, start + LATENCY_STEPS, step_ms / 1e3, leak)
    summary = doctor.finish()
    found = [f for f in summary.findings if f.final_state in ("leak", "remedied", "minor") and f.metric == "rss_bytes"]
    detected = min((f.detected_step for f in found), default=None)
    return {"step_ms": step_ms, "start": start, "leak_kib": size / 1024, "cause": found[0].cause if found else None,
            "steps": detected - start if detected is not None else None, **before}


def floor() -> dict[str, Any]:
    """Median CPU time, after each gap of busy work, of: an empty call; the bare minimum of a sample; an
    RSS-only sample (leakdoctor's statm reader and one series append, what a glance between full samples
    would cost); one doctor sample. All in the same loop, in turn, so that drift hits each."""
    import os

    from leakdoctor.integrations import MetricSpec
    from leakdoctor.integrations.process import RssReader
    from leakdoctor.reading.series import Series

    doctor = doctor_for("python", overhead=1.0)
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    kept: list[float] = []
    read, series = RssReader(), Series(MetricSpec("rss_bytes"), window=6, warmup=0)
    glances = [0]

    def empty() -> None:
        pass

    def bare() -> None:
        kept.append(float(os.pread(fd, 128, 0).split()[1]))
        kept.append(time.process_time())
        kept.append(time.perf_counter())

    def rss_only() -> None:
        step = glances[0] = glances[0] + 6  # one sample a window, each closing its window at once
        series.add(step, read(), step + 6)

    def sample() -> None:
        doctor._countdown = 0  # the next step is sampled
        doctor.step()

    calls = {"empty": empty, "bare": bare, "rss_only": rss_only, "doctor": sample}
    result = {}
    for gap in FLOOR_GAPS_MS:
        costs: dict[str, list[float]] = {name: [] for name in calls}
        for name in [*calls] * FLOOR_SAMPLES:  # in turn
            busy(gap / 1e3)
            start = time.thread_time()
            calls[name]()
            costs[name].append(time.thread_time() - start)
        result[gap] = {name: 1e6 * statistics.median(values[10:]) for name, values in costs.items()}
        kept.clear()
    doctor.finish()
    os.close(fd)
    return result


def child(args: list[str]) -> None:
    what = args[0]
    if what == "cost":
        result = sample_cost(args[1])
    elif what == "fraction":
        result = fraction(args[1], float(args[2]))
    elif what == "floor":
        result = floor()
    else:
        result = latency(float(args[1]), args[2] == "settled")
    print(json.dumps(result))


def run(*args: object) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    kinds = ("python", "torch", "jax", "keras", "mlx")
    costs = {kind: run("cost", kind) for kind in kinds}
    fractions = [run("fraction", kind, ms) for kind in ("python", "torch") for ms in STEP_MS]
    latencies = [run("latency", ms, when) for when in ("early", "settled") for ms in STEP_MS]
    floors = run("floor")
    print(json.dumps({"costs": costs, "fractions": fractions, "latencies": latencies, "floor": floors}, indent=1),
          flush=True)
    write_section("01_overhead", section(costs, fractions, latencies, floors, ("python", "torch")))


def section(costs: dict[str, Any], fractions: list[dict[str, Any]], latencies: list[dict[str, Any]],
            floors: dict[str, Any], fraction_kinds: tuple[str, ...]) -> str:
    cost_rows = [[kind, _us(c, "median_us"), _us(c, "p90_us"), c.get("findings", c.get("error"))]
                 for kind, c in costs.items()]
    kinds = [k for k in fraction_kinds for _ in STEP_MS]
    fraction_rows = [[kind, f"{f.get('step_ms', '?')} ms", f.get("steps", "-"), _pct(f, "outside"), _pct(f, "own"),
                      _gap(f), f.get("stride", f.get("error")), f.get("investigations", "-"),
                      f"{f.get('forensic_s', 0):.2f} s", f.get("latency", "-"), f.get("findings", "-")]
                     for kind, f in zip(kinds, fractions)]
    floor_rows = [[f"{gap} ms", *(f"{f[name]:.1f} µs" for name in ("empty", "bare", "rss_only", "doctor")),
                   f"{f['doctor'] / f['bare']:.1f}"]
                  for gap, f in floors.items()] if "error" not in floors else [["-", floors["error"], "-", "-", "-", "-"]]
    latency_rows = [[f"{r.get('step_ms', '?')} ms", r.get("start", "-"), f"{r.get('leak_kib', 0):.0f} KiB",
                     r.get("cause", r.get("error")), r.get("steps"), r.get("stride", "-"), r.get("promised", "-")]
                    for r in latencies]
    return f"""
## What a sample costs, and what the budget buys (issue #11)

`.venv/bin/python benchmarks/run.py overhead` on {machine()}.
Steps are busy waits of the stated length; every figure is timed by the caller around `doctor.step()`
in the same loop, one fresh process per row.

Cost of one sample, every step sampled (`overhead=1.0`, 1 ms steps, {SAMPLES} steps), in a process with
the framework and the doctor's integration for it loaded. Targets: median at most 15 µs in plain Python,
40 µs with a framework's probes.

{table(["process", "median per sample", "90th percentile", "findings"], cost_rows)}

At the defaults (0.5% budget), {RUN_SECONDS} s of steps per row. "outside": time inside `doctor.step()`
(investigations taken out) over the user's time between calls, both timed by the caller; "own": the
doctor's own account (`summary.overhead["fraction_of_step_time"]`). Targets: at most 0.5% at every step
length; outside and own within 0.2 percentage points. Investigations are reported apart, with their total
time; "latency" is the summary's `overhead["latency_steps"]`: the steps a fast leak needs to be found at
the stride the budget chose.

{table(["process", "step", "steps", "outside", "own", "gap", "stride", "investigations", "investigation time",
        "latency", "findings"], fraction_rows)}

Detection latency at the defaults: plain Python, a leak of {LEAK_SHARE:.1%} of RSS per step (bytes kept in a
list) from step {LEAK_START} (the pacer still widening its stride) or after {SETTLED_SECONDS:.0f} s of steps (the
stride settled). Target: at most 50 steps from its start to the finding. "stride" and "summary's latency"
are the doctor's as the leak starts (`doctor.summary.overhead`: `sample_stride`, `latency_steps`).

{table(["step", "leak from step", "leak per step", "cause", "steps to detect", "stride", "summary's latency"],
       latency_rows)}

The machine's floor: this thread's CPU time, each right after the stated time of busy work (median of
{FLOOR_SAMPLES} each, in turn), for an empty Python call; the bare minimum of a sample (one pread of
/proc/self/statm, the process's CPU clock, three appends); an RSS-only sample (leakdoctor's statm reader
and one append to a series, each closing a window: what a glance between full samples would cost); and
one sample of the doctor in plain Python. The same few microseconds of work cost several times more
once other work has had the caches and the TLB for a while: the doctor's sample at a stride of many
steps pays that, and so would any counter read. At 1 ms steps the 0.5% budget is 5 µs a step, so
reading resident memory once a window (every 6 steps, what a 50-step latency needs) must cost at most
30 µs after 6 ms of other work, the whole budget.

{table(["after", "empty call", "bare minimum", "RSS-only sample", "doctor's sample", "doctor / bare"], floor_rows)}
"""


def _us(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.1f} µs" if key in row else "-"


def _pct(row: dict[str, Any], key: str) -> str:
    return f"{100 * row[key]:.2f}%" if key in row else "-"


def _gap(row: dict[str, Any]) -> str:
    return f"{100 * abs(row['outside'] - row['own']):.2f} pp" if "own" in row else "-"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1:])
    else:
        main()
