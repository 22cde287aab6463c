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
   against what the summary says the budget bought (`overhead["latency_steps"]`); and, from the summary
   at the end, where resident memory's rise was watched (`overhead["sampling"]`) and the sampler thread's CPU time.
4. The machine's floor: an empty call, a sample's bare minimum (one pread of /proc/self/statm, the
   process's CPU clock, three appends to a list), an RSS-only sample and one sample of the doctor (plain
   Python), each after 1, 5 and 20 ms of other work, in this thread's CPU time. What a few microseconds
   of work cost depends on how long the caches and the TLB have been someone else's. And the floor of
   the sampler thread: the CPU time of one wake of a Python thread sleeping in a loop while the main
   thread busy-waits, bare and with a read of resident memory.
5. `doctor.step()` at the defaults (issue #23), from outside, for each framework's process and steps of
   1, 5 and 20 ms: median and 90th percentile of the caller-timed call, beside those of an empty method
   call on a plain object timed in the same loop after the same busy work (the machine's floor); the
   sampling mode at the end, the sampler thread's CPU time over the loop's wall time, and the stride.
6. Slowdown (issue #23): the work done in a fixed time with and without the doctor, in alternating
   blocks in one process per row, for steps that release the GIL (numpy matmuls) and pure-Python steps,
   at the default sampler and, for pure-Python steps, with the thread or inline sampling forced.

Each measurement runs in a fresh subprocess (`python benchmarks/bench_overhead.py WHAT ...` runs one:
`cost KIND`, `fraction KIND MS`, `latency MS early|settled`, `floor`, `defaults KIND MS`,
`slowdown gil|python MS [auto|thread|inline]`), so no framework's imports or threads touch another's
figures. Steps are busy waits on the clock, so the step time is what it says on the tin whatever the
machine's load; except in 6, whose steps are units of work (the throughput is what it measures).
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
WAKE_SECONDS = 2.0
WAKE_SLEEP = 0.01
DEFAULT_SECONDS = 8
SKIP_CALLS = 50  # of each of the two calls timed in turn: the first 100 steps
BLOCK_SECONDS = 3.0
WARM_SECONDS = 2.0
PAIRS = 4
SLOWDOWN_KINDS = ("gil", "python")
FORCED = ("thread", "inline")
MATRIX = 128


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
        from leakdoctor.integrations._keras import Calls
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
    from leakdoctor.integrations._process import RssReader

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
            "steps": detected - start if detected is not None else None, **before,
            "sampling": summary.overhead["sampling"], "thread_cpu_s": summary.overhead["thread_cpu_seconds"]}


def floor() -> dict[str, Any]:
    """Median CPU time, after each gap of busy work, of: an empty call; the bare minimum of a sample; an
    RSS-only sample (leakdoctor's statm reader and one series append, what a glance between full samples
    would cost); one doctor sample. All in the same loop, in turn, so that drift hits each. Then, under
    "thread", the sampler thread's floor: one wake of a sleeping thread, bare and with a statm read."""
    import os

    from leakdoctor.integrations import MetricSpec
    from leakdoctor.integrations._process import ResidentReader, RssReader
    from leakdoctor._reading.series import Series

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
        doctor._engine.wake()  # the next step is sampled
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
    rss = RssReader()
    result["thread"] = {"wake": wake_cost(), "wake_read": wake_cost(ResidentReader(rss))}
    rss.close()
    return result


def wake_cost(read: Callable[[], float] | None = None) -> dict[str, float]:
    """The CPU time of one wake of a Python thread that sleeps WAKE_SLEEP in a loop (calling `read` after
    each sleep, if given) for WAKE_SECONDS while this thread busy-waits in Python, as a training step
    does: its `time.thread_time()` at the end over its wakes, the GIL's handover included. And the
    interval at which the sampler thread's budget (THREAD_BUDGET of a core) affords such wakes."""
    import threading

    from leakdoctor._reading.thread import THREAD_BUDGET

    stop, done = threading.Event(), {}

    def sleeper() -> None:
        start, wakes = time.thread_time(), 0
        while not stop.is_set():
            time.sleep(WAKE_SLEEP)
            if read is not None:
                read()
            wakes += 1
        done.update(cpu=time.thread_time() - start, wakes=wakes)

    thread = threading.Thread(target=sleeper, name="bench-sleeper", daemon=True)
    thread.start()
    busy(WAKE_SECONDS)
    stop.set()
    thread.join()
    cost = done["cpu"] / max(1, done["wakes"])
    return {"us": 1e6 * cost, "wakes": done["wakes"], "every_ms": 1e3 * cost / THREAD_BUDGET}


class Plain:
    """An object whose method does nothing: what any call at the end of a step costs at least."""

    def step(self) -> None:
        pass


def at_defaults(kind: str, step_ms: float) -> dict[str, Any]:
    """`doctor.step()` at the defaults, timed by the caller, and an empty method call on a plain object,
    in the same loop: a coin per step (random, so that it cannot fall in step with the stride) says which
    of the two is timed, right after the step's busy work; on the steps that time the empty call,
    `doctor.step()` follows it untimed, so the doctor sees every step. The first SKIP_CALLS timings of each
    are left out. The sampler thread's CPU time is taken over the loop's wall time."""
    import random

    doctor, plain, coin = doctor_for(kind), Plain(), random.Random(0)
    clock, step_seconds = time.perf_counter, step_ms / 1e3
    steps = int(DEFAULT_SECONDS / step_seconds)
    inside, empty = [], []
    begin = clock()
    for _ in range(steps):
        busy(step_seconds)
        if coin.random() < 0.5:
            start = clock()
            doctor.step()
            inside.append(clock() - start)
        else:
            start = clock()
            plain.step()
            empty.append(clock() - start)
            doctor.step()
    wall = clock() - begin
    summary = doctor.finish()
    overhead = summary.overhead
    return {"step_ms": step_ms, "steps": steps, **_quantiles(inside, "", SKIP_CALLS),
            **_quantiles(empty, "empty_", SKIP_CALLS), "sampling": overhead["sampling"],
            "thread_share": overhead["thread_cpu_seconds"] / wall, "stride": overhead["sample_stride"],
            "run_fraction": overhead["fraction_of_run_time"], "findings": len(summary.findings)}


def _quantiles(seconds: list[float], prefix: str, skip: int = 0) -> dict[str, float]:
    kept = sorted(seconds[skip:])
    return {f"{prefix}median_us": 1e6 * statistics.median(kept), f"{prefix}p90_us": 1e6 * kept[int(0.9 * len(kept))]}


def unit_of_work(kind: str, step_seconds: float) -> Callable[[], None]:
    """One step's work of about `step_seconds`, calibrated once: "gil", MATRIX x MATRIX numpy matmuls in a
    loop (BLAS releases the GIL); "python", a pure-Python arithmetic loop (which holds it)."""
    if kind == "gil":
        import numpy as np

        matrix = np.random.default_rng(0).standard_normal((MATRIX, MATRIX)) / MATRIX

        def work(n: int) -> None:
            for _ in range(n):
                matrix @ matrix
    elif kind == "python":
        def work(n: int) -> None:
            total = 0
            for i in range(n):
                total += i * i % 7
    else:
        raise ValueError(kind)
    n = calibrate(work, step_seconds)
    return lambda: work(n)


def calibrate(work: Callable[[int], None], seconds: float) -> int:
    """The n for which work(n) takes about `seconds`: doubled until a run takes a tenth of it, scaled,
    then scaled again by the median of five runs."""
    n = 1
    while _timed(work, n) < seconds / 10:
        n *= 2
    n = max(1, round(n * seconds / _timed(work, n)))
    return max(1, round(n * seconds / statistics.median(_timed(work, n) for _ in range(5))))


def _timed(work: Callable[[int], None], n: int) -> float:
    start = time.perf_counter()
    work(n)
    return time.perf_counter() - start


def throughput(unit: Callable[[], None], doctor: Any | None, seconds: float = BLOCK_SECONDS) -> tuple[float, float]:
    """Units of work per second over a block of `seconds`: the units completed until the first to end
    past it, over the wall time to its end (so that the rate loses no fraction of a unit), and over the
    process's CPU time (every thread's: the sampler thread's too), which other processes taking the
    cores inflate less; with the doctor, `doctor.step()` after each unit."""
    clock = time.perf_counter
    start, cpu = clock(), time.process_time()
    end, units = start + seconds, 0
    if doctor is None:
        while True:
            unit()
            units += 1
            now = clock()
            if now >= end:
                break
    else:
        while True:
            unit()
            doctor.step()
            units += 1
            now = clock()
            if now >= end:
                break
    return units / (now - start), units / (time.process_time() - cpu)


def slowdown(kind: str, step_ms: float, sampler: str = "auto") -> dict[str, Any]:
    """Work done in a fixed time without and with the doctor, in one process: blocks of BLOCK_SECONDS in
    the order without, with, with, without, ... (PAIRS pairs). Without: the loop alone, no doctor exists
    and no sampler thread runs. With: a fresh LeakDoctor(verbose=False, sampler=sampler) built and run for
    WARM_SECONDS before the block (its warm-up and the pacer's first strides: a long run's steady state is
    timed), `doctor.step()` after each unit, finished after it (the sampler thread joined, outside the
    block). The slowdown of a pair is rate without / rate with - 1; the spread of the blocks without
    (max - min over their median) is the machine's noise."""
    import gc
    import threading

    from leakdoctor import LeakDoctor

    unit = unit_of_work(kind, step_ms / 1e3)
    rates: dict[str, list[float]] = {"without": [], "with": []}
    cpu_rates: dict[str, list[float]] = {"without": [], "with": []}
    modes, shares, accounts = [], [], []
    for side in ("without", "with", "with", "without") * (PAIRS // 2) + ("without", "with") * (PAIRS % 2):
        gc.collect()
        doctor = LeakDoctor(verbose=False, sampler=sampler) if side == "with" else None
        if doctor is not None:  # its warm-up and the pacer's first strides, untimed: a long run's steady state
            throughput(unit, doctor, WARM_SECONDS)
        start = time.perf_counter()
        rate, cpu_rate = throughput(unit, doctor)
        wall = time.perf_counter() - start
        rates[side].append(rate)
        cpu_rates[side].append(cpu_rate)
        if doctor is None:
            continue
        overhead = doctor.finish().overhead
        modes.append(overhead["sampling"])
        shares.append(overhead["thread_cpu_seconds"] / wall)
        accounts.append(overhead["fraction_of_run_time"])
        del doctor
        for thread in threading.enumerate():
            if thread.name == "leakdoctor-sampler":
                thread.join(timeout=5)
    without = rates["without"]
    return {"kind": kind, "step_ms": step_ms, "sampler": sampler,
            "unit_ms": 1e3 / statistics.median(without), "units": round(BLOCK_SECONDS * statistics.median(without)),
            **_paired(rates, ""), **_paired(cpu_rates, "cpu_"), "modes": modes,
            "thread_share": statistics.median(shares), "account": statistics.median(accounts)}


def _paired(rates: dict[str, list[float]], prefix: str) -> dict[str, Any]:
    """The slowdown of each pair of blocks (rate without / rate with - 1): median, min, max, all; and the
    spread of the blocks without the doctor ((max - min) / median): the noise."""
    slowdowns = [without / with_ - 1 for without, with_ in zip(rates["without"], rates["with"])]
    without = rates["without"]
    return {f"{prefix}slowdown": statistics.median(slowdowns), f"{prefix}low": min(slowdowns),
            f"{prefix}high": max(slowdowns), f"{prefix}slowdowns": slowdowns,
            f"{prefix}spread": (max(without) - min(without)) / statistics.median(without)}


def child(args: list[str]) -> None:
    what = args[0]
    if what == "cost":
        result = sample_cost(args[1])
    elif what == "fraction":
        result = fraction(args[1], float(args[2]))
    elif what == "floor":
        result = floor()
    elif what == "defaults":
        result = at_defaults(args[1], float(args[2]))
    elif what == "slowdown":
        result = slowdown(args[1], float(args[2]), *args[3:4])
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
    defaults = [{"kind": kind, "step_ms": ms, **run("defaults", kind, ms)} for kind in kinds for ms in STEP_MS]
    slowdowns = [{"kind": kind, "step_ms": ms, "sampler": sampler, **run("slowdown", kind, ms, sampler)}
                 for kind, sampler in [(k, "auto") for k in SLOWDOWN_KINDS] + [("python", f) for f in FORCED]
                 for ms in STEP_MS]
    print(json.dumps({"costs": costs, "fractions": fractions, "latencies": latencies, "floor": floors,
                      "defaults": defaults, "slowdowns": slowdowns}, indent=1), flush=True)
    write_section("01_overhead", section(costs, fractions, latencies, floors, ("python", "torch"), defaults, slowdowns))


def section(costs: dict[str, Any], fractions: list[dict[str, Any]], latencies: list[dict[str, Any]],
            floors: dict[str, Any], fraction_kinds: tuple[str, ...], defaults: list[dict[str, Any]],
            slowdowns: list[dict[str, Any]]) -> str:
    cost_rows = [[kind, _us(c, "median_us"), _us(c, "p90_us"), c.get("findings", c.get("error"))]
                 for kind, c in costs.items()]
    kinds = [k for k in fraction_kinds for _ in STEP_MS]
    fraction_rows = [[kind, f"{f.get('step_ms', '?')} ms", f.get("steps", "-"), _pct(f, "outside"), _pct(f, "own"),
                      _gap(f), f.get("stride", f.get("error")), f.get("investigations", "-"),
                      f"{f.get('forensic_s', 0):.2f} s", f.get("latency", "-"), f.get("findings", "-")]
                     for kind, f in zip(kinds, fractions)]
    gaps = {gap: f for gap, f in floors.items() if gap not in ("thread", "error")}
    floor_rows = [[f"{gap} ms", *(f"{f[name]:.1f} µs" for name in ("empty", "bare", "rss_only", "doctor")),
                   f"{f['doctor'] / f['bare']:.1f}"]
                  for gap, f in gaps.items()] if "error" not in floors else [["-", floors["error"], "-", "-", "-", "-"]]
    wakes = floors.get("thread", {})
    wake_rows = [[name, f"{w['us']:.0f} µs", w["wakes"], f"{w['every_ms']:.0f} ms"] for name, w in
                 (("a bare wake", wakes.get("wake")), ("a wake and a read of resident memory", wakes.get("wake_read")))
                 if w] or [["-", floors.get("error", "-"), "-", "-"]]
    latency_rows = [[f"{r.get('step_ms', '?')} ms", r.get("start", "-"), f"{r.get('leak_kib', 0):.0f} KiB",
                     r.get("cause", r.get("error")), r.get("steps"), r.get("stride", "-"), r.get("promised", "-"),
                     r.get("sampling", "-"), _ms(r, "thread_cpu_s")]
                    for r in latencies]
    default_rows = [[d["kind"], f"{d['step_ms']} ms", d.get("steps", d.get("error", "-")),
                     *(_us(d, key, 2) for key in ("median_us", "empty_median_us", "p90_us", "empty_p90_us")),
                     d.get("sampling", "-"), _pct(d, "thread_share"), d.get("stride", "-"), _pct(d, "run_fraction"),
                     d.get("findings", "-")]
                    for d in defaults]
    slowdown_rows = [[r["kind"], f"{r['step_ms']} ms", r["sampler"], _ms(r, "unit_ms", 1e-3),
                      r.get("units", r.get("error", "-")), _pct(r, "slowdown", "+"), _range(r, ""), _pct(r, "spread"),
                      _pct(r, "cpu_slowdown", "+"), _range(r, "cpu_"), _pct(r, "cpu_spread"), _modes(r),
                      _pct(r, "thread_share"), _pct(r, "account")]
                     for r in slowdowns]
    return f"""
## What a sample costs, and what the budget buys

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
are the doctor's as the leak starts (`doctor.summary.overhead`: `sample_stride`, `latency_steps`);
"sampling" and "thread CPU" its summary's at the end (`overhead["sampling"]`: where resident memory's rise
was watched, "thread" or "inline"; `overhead["thread_cpu_seconds"]`).

{table(["step", "leak from step", "leak per step", "cause", "steps to detect", "stride", "summary's latency",
        "sampling", "thread CPU"], latency_rows)}

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

The sampler thread's floor: the CPU time of one wake of a Python thread that sleeps {WAKE_SLEEP * 1e3:.0f} ms in
a loop for {WAKE_SECONDS:.0f} s while the main thread busy-waits in Python (its `time.thread_time()` over its
wakes, the GIL's handover included), bare and with a read of resident memory
(`leakdoctor.integrations._process.ResidentReader`); and how far apart the thread's budget (0.4% of a
core) allows such wakes. Where a window of steps is shorter than that, the thread cannot afford a reading
a window, and with `sampler="auto"` it watches the memory limit only (resident memory's rise is then
watched on the sampled steps).

{table(["what", "CPU per wake", "wakes", "affordable every"], wake_rows)}

### The doctor at its defaults, from outside

`doctor.step()` at the defaults (`sampler="auto"`), {DEFAULT_SECONDS} s of busy-wait steps per row, one fresh
process per row with the framework and the doctor's integration for it loaded. In the same loop, a
random coin per step says which of two calls is timed by the caller, right after the step's busy work:
`doctor.step()`, or an empty method call on a plain object (then followed by an untimed
`doctor.step()`, so the doctor sees every step). The empty call is the machine's floor for any call at
the end of a step: after milliseconds of other work, even it pays for caches and a TLB that are no longer
its own. The first {SKIP_CALLS} timings of each (about the first {2 * SKIP_CALLS} steps) are left out. "sampling": `overhead["sampling"]` at the end; "thread
CPU": `overhead["thread_cpu_seconds"]` over the loop's wall time, as a share of one core; "total": the
summary's `overhead["fraction_of_run_time"]` (step()'s own time, investigations and the thread's CPU, over
the run). Targets: median at most 1 µs, 90th percentile at most 5 µs, thread CPU at most 0.5% of one
core. Where the empty call's median is above 1 µs, the 1 µs target is below this machine's floor.

{table(["process", "step", "steps", "step() median", "empty call median", "step() p90", "empty call p90",
        "sampling", "thread CPU", "stride", "total", "findings"], default_rows)}

Slowdown: the work done in a fixed time with and without the doctor, in one process per row. A step is
a unit of work calibrated once at the start to about the stated time: "gil", {MATRIX}x{MATRIX} numpy matmuls
in a loop (BLAS releases the GIL, so the sampler thread need not wait for it); "python", a pure-Python
arithmetic loop (which holds the GIL: the thread's every wake waits for the training thread to hand it
over). Blocks of {BLOCK_SECONDS:.0f} s alternate without, with, with, without, ... ({PAIRS} pairs): without, the
loop alone (no doctor exists, no sampler thread runs); with, a fresh `LeakDoctor(verbose=False,
sampler=...)` built and run for {WARM_SECONDS:.0f} s before the block (its warm-up and the pacer's learning: the
block times a long run's steady state), `doctor.step()` after each unit, finished (and its thread joined)
after the block, outside it. A block's rate is the units completed over the time to the end of the last
(wall time; and, beside it, the process's CPU time, the sampler thread's included, which other processes
taking the cores inflate less). Slowdown: the median over pairs of rate without / rate with - 1,
with its min and max over the pairs; "noise": the spread of the blocks without the doctor ((max - min)
/ median), what this machine does to the same work from one block to the next. "unit" is the measured
time per unit without the doctor. "mode": `overhead["sampling"]` at the end of each with-block;
"thread CPU": its `thread_cpu_seconds` over the block, as a share of one core; "doctor's account": the
summary's `overhead["fraction_of_run_time"]`, the doctor's own figure for the same blocks. The rows with
`sampler="thread"` and `sampler="inline"` force the mode on pure-Python steps, to show which costs the
training loop more there, and which `"auto"` chose. Target: a slowdown of at most 0.2%. A slowdown
smaller than the noise is not resolved: on a shared machine, pure-Python throughput moves by several
percent from block to block, and a median over {PAIRS} pairs does not average that away.

{table(["work", "step", "sampler", "unit", "units per block", "slowdown", "min - max", "noise",
        "slowdown (CPU time)", "min - max (CPU)", "noise (CPU)", "mode", "thread CPU", "doctor's account"],
       slowdown_rows)}
"""


def _us(row: dict[str, Any], key: str, digits: int = 1) -> str:
    return f"{row[key]:.{digits}f} µs" if key in row else "-"


def _pct(row: dict[str, Any], key: str, sign: str = "") -> str:
    return f"{100 * row[key]:{sign}.2f}%" if key in row else "-"


def _ms(row: dict[str, Any], key: str, unit: float = 1.0) -> str:
    """row[key], in `unit` seconds, in milliseconds."""
    return f"{row[key] * unit * 1e3:.1f} ms" if key in row else "-"


def _range(row: dict[str, Any], prefix: str) -> str:
    return f"{100 * row[prefix + 'low']:+.2f}% - {100 * row[prefix + 'high']:+.2f}%" if prefix + "low" in row else "-"


def _modes(row: dict[str, Any]) -> str:
    """The sampling modes of the with-blocks, counted: "thread x4", "inline x3, thread x1"."""
    counts: dict[str, int] = {}
    for mode in row.get("modes", ()):
        counts[mode] = counts.get(mode, 0) + 1
    return ", ".join(f"{mode} x{n}" for mode, n in sorted(counts.items())) or "-"


def _gap(row: dict[str, Any]) -> str:
    return f"{100 * abs(row['outside'] - row['own']):.2f} pp" if "own" in row else "-"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1:])
    else:
        main()
