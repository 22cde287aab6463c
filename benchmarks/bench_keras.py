"""Keras 3: what LeakDoctorCallback costs in a fit, and what it does to models built in a loop, on the jax
and the torch backend (each measurement in a fresh process: the backend is fixed when keras is imported).

Overhead: a 64-256-1 MLP, batches of 64, one epoch of WARM + BATCHES batches per fit, with and without the
callback; CPU time of this process per batch after batch WARM (compiles left out); median ratio over
pairs of fits run back to back, alternating which goes first.

Models in a loop (keras#2102): 40 models (64-256-256-1, Adam) built and fitted one epoch each, resident
memory after every fit, in three variants: no callback; keras.backend.clear_session() before each model;
LeakDoctorCallback(remedies="all") reused across the fits. Growth per fit: Theil–Sen slope over fits 4-40.
The measurements run two processes at a time (the machine has two cores); resident memory is per
process, and the cost columns are each process's own CPU time.

Run: .venv/bin/python benchmarks/run.py keras
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import machine, paired_ratio, table, write_section  # noqa: E402
from helpers import isolated  # noqa: E402

from leakdoctor._base.trend import theil_sen  # noqa: E402

BACKENDS = ("jax", "torch")
PAIRS = 5
WARM = 30
BATCHES = 150
FITS = 40


def keras_on(backend: str) -> Any:
    os.environ["KERAS_BACKEND"] = backend
    import warnings

    warnings.filterwarnings("ignore")
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    import keras

    return keras


def overhead(backend: str) -> dict:
    """Paired CPU time per batch with/without the callback, and the callback's own account."""
    keras = keras_on(backend)
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    class CpuClock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == WARM - 1:
                self.start = time.process_time()

        def on_train_end(self, logs: Any = None) -> None:
            self.per_batch = (time.process_time() - self.start) / BATCHES

    rng = np.random.default_rng(0)
    x = rng.normal(size=((WARM + BATCHES) * 64, 64)).astype("float32")
    y = x[:, :1] * 0.5
    doctors: list[Any] = []
    baselines: list[float] = []

    def fit(watched: bool) -> float:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        clock = CpuClock()
        extra = [LeakDoctorCallback(verbose=False)] if watched else []
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[clock, *extra])
        doctors.extend(extra)
        if not watched:
            baselines.append(clock.per_batch)
        return clock.per_batch

    fit(False)
    baselines.clear()
    median, pairs = paired_ratio(lambda: fit(False), lambda: fit(True), PAIRS)
    account = statistics.median(d.finish().overhead["fraction_of_step_time"] for d in doctors)
    return {"median": median, "pairs": pairs, "batch": statistics.median(baselines), "account": account}


def models_in_a_loop(backend: str, variant: str) -> dict:
    """Resident memory after each of FITS fits, and the CPU time of the loop."""
    keras = keras_on(backend)
    import psutil

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 64)).astype("float32")
    y = x[:, :1] * 0.5
    doctor = LeakDoctorCallback(remedies="all", memory_limit="4GiB", verbose=False) if variant == "doctor" else None
    process, rss = psutil.Process(), []
    start = time.process_time()
    for _ in range(FITS):
        if variant == "clear_session":
            keras.backend.clear_session()
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[doctor] if doctor else [])
        rss.append(process.memory_info().rss)
    seconds = time.process_time() - start
    remedy = None
    if doctor is not None:
        summary = doctor.finish()
        treated = [f for f in summary.findings if f.remedy and f.remedy.name == "clear_session"]
        if treated:
            f = treated[0]
            remedy = (f.cause, f.remedy.applied_step, f.rate_per_step, f.remedy.rate_after, f.remedy.effective)
    return {"rss": rss, "seconds": seconds, "remedy": remedy}


def mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def main() -> None:
    load_before = os.getloadavg()[0]
    jobs = [(models_in_a_loop, b, v) for b in BACKENDS for v in ("clear_session", "doctor", "none")]
    jobs += [(overhead, b) for b in BACKENDS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # each job runs in a process of its own
        done = dict(zip([job[1:] for job in jobs], pool.map(lambda job: isolated(*job, timeout=1800), jobs)))
    costs = {b: done[(b,)] for b in BACKENDS}
    loops = {(b, v): done[(b, v)] for b in BACKENDS for v in ("none", "clear_session", "doctor")}
    load = f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"

    cost_rows = [[b, f"{c['batch'] * 1e3:.2f}", f"{c['median']:.3f}", ", ".join(f"{r:.3f}" for r in sorted(c["pairs"])),
                  f"{c['account']:.2%}"] for b, c in costs.items()]
    loop_rows, remedies = [], []
    fits = np.arange(1, FITS + 1)
    for (backend, variant), run in loops.items():
        rss = np.asarray(run["rss"], dtype=float)
        slope = theil_sen(fits[3:], rss[3:])[0]
        loop_rows.append([backend, variant, mib(rss[3]), mib(rss[-1]), mib(rss[-1] - rss[3]), mib(slope),
                          f"{run['seconds']:.0f}"])
        if run["remedy"]:
            cause, applied, before, after, effective = run["remedy"]
            slope_after = theil_sen(fits[applied:], rss[applied:])[0]
            remedies.append(f"{backend}: {cause} found, clear_session applied after fit {applied}, "
                            f"{mib(before)} MiB/fit before, {mib(after)} MiB/fit after by its account "
                            f"(effective: {effective}); resident memory measured here peaked at "
                            f"{mib(rss[:applied].max())} MiB by fit {applied}, then stayed at "
                            f"{mib(rss[applied:].min())}-{mib(rss[applied:].max())} MiB, {mib(slope_after)} MiB/fit "
                            f"over fits {applied + 1}-{FITS}")
    write_section("keras", f"""## Keras 3: LeakDoctorCallback overhead, and models built in a loop

Command: `.venv/bin/python benchmarks/run.py keras`. Machine: {machine()}. Load average {load}.

### Overhead in a fit

A 64-256-1 MLP, SGD, batches of 64, one epoch of {WARM + BATCHES} batches per fit; CPU time per batch after
batch {WARM} (the compiles left out); median of {PAIRS} back-to-back pairs of fits, alternating order. The
timing callback reads the clock in `on_train_batch_end`, so Keras runs the batch-end callbacks in line in
both variants (it hands them to a thread pool only when no callback overrides a batch-end hook;
LeakDoctorCallback steps in `on_train_batch_begin` and leaves that choice to Keras).

{table(["backend", "CPU ms/batch without", "with / without (median)", f"{PAIRS} pairs, sorted",
        "callback's own account"], cost_rows)}

The last column is the fraction of step time the callback's probes took by its own account (samples
within 0.5% of step time by default). The pairs' spread shows how far this machine resolves a difference.

### Models built in a loop

{FITS} models (64-256-256-1, Adam, 4 batches of 64, one epoch) built and fitted one after another. Resident
memory in MiB after fit 4 and after fit {FITS}; growth per fit is the Theil–Sen slope over fits 4-{FITS}; the
CPU seconds of the loop include building and compiling the models (and, where it runs, clear_session's
full gc.collect()).

{table(["backend", "variant", "RSS fit 4", f"RSS fit {FITS}", "growth", "MiB per fit", "CPU seconds"], loop_rows)}

What the callback did (remedies="all"; its investigations' gc.collect() also frees old models now and
then, hence the doctor rows' net growth): {"; ".join(remedies) or "nothing"}.
""")


if __name__ == "__main__":
    main()
