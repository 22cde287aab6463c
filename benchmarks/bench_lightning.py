"""Lightning: what LeakDoctorCallback costs, against Lightning's own DeviceStatsMonitor(cpu_stats=True) and
against no callback, on the same model and data (the tests' Regressor: a 64-256-1 MLP, batches of 64).

Each fit runs STEPS training steps with a CSV logger (DeviceStatsMonitor needs one; all variants log the
same way, every 50 steps). A timing callback reads this process's CPU time (time.process_time: the machine
is shared, and the costs compared are CPU work) at batch WARM and at the last batch, so Trainer start-up
and the first steps are left out. Ratios are medians over pairs of fits run back to back, alternating
which goes first (benchmarks.common.paired_ratio).

Run: .venv/bin/python benchmarks/run.py lightning
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers import CSVLogger

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import machine, paired_ratio, table, write_section  # noqa: E402
from test_lightning import Regressor, loader, trainer_options  # noqa: E402

from leakdoctor.callbacks.lightning import LeakDoctorCallback  # noqa: E402

STEPS = 600
WARM = 100
PAIRS = 5


class CpuClock(L.Callback):
    """CPU seconds per step between batch WARM and the last batch."""

    def __init__(self) -> None:
        self.start = 0.0
        self.per_step = 0.0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == WARM:
            self.start = time.process_time()
        elif batch_idx == STEPS - 1:
            self.per_step = (time.process_time() - self.start) / (STEPS - 1 - WARM)


def fit(extra: list[Any], folder: str) -> float:
    """CPU seconds per step of one fit with the given extra callbacks."""
    clock = CpuClock()
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_steps=STEPS, log_every_n_steps=50, callbacks=[clock, *extra],
                        logger=CSVLogger(folder, name="bench"), **trainer_options())
    trainer.fit(Regressor(), loader(STEPS))
    return clock.per_step


def doctor_overhead(folder: str) -> tuple[float, str]:
    """The doctor's own account of its cost in one fit, and its verdict."""
    callback = LeakDoctorCallback(verbose=False)
    fit([callback], folder)
    summary = callback.summary
    return summary.overhead["fraction_of_step_time"], summary.verdict


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        none = lambda: fit([], folder)  # noqa: E731
        doctor = lambda: fit([LeakDoctorCallback(verbose=False)], folder)  # noqa: E731
        monitor = lambda: fit([DeviceStatsMonitor(cpu_stats=True)], folder)  # noqa: E731
        step = statistics.median(none() for _ in range(3))
        ratios = {
            "LeakDoctorCallback / no callback": paired_ratio(none, doctor, PAIRS),
            "DeviceStatsMonitor(cpu_stats=True) / no callback": paired_ratio(none, monitor, PAIRS),
            "LeakDoctorCallback / DeviceStatsMonitor(cpu_stats=True)": paired_ratio(monitor, doctor, PAIRS),
        }
        fraction, verdict = doctor_overhead(folder)
    load = f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    spread = max(max(pairs) - min(pairs) for _, pairs in ratios.values()) / 2
    rows = [[name, f"{median:.3f}", ", ".join(f"{r:.3f}" for r in sorted(pairs))]
            for name, (median, pairs) in ratios.items()]
    write_section("lightning", f"""## Lightning: LeakDoctorCallback overhead

Command: `.venv/bin/python benchmarks/run.py lightning`. Machine: {machine()}.

The tests' Regressor (64-256-1 MLP, batches of 64, SGD) for {STEPS} steps per fit on CPU, one torch thread,
a CSV logger writing every 50 steps in every variant. CPU time per step of this process from batch {WARM}
to the last (Trainer start-up left out); median of {PAIRS} back-to-back pairs per ratio, alternating order.
Without any callback a step took {step * 1e3:.2f} ms of CPU.

{table(["ratio of CPU time per step", "median", f"{PAIRS} pairs, sorted"], rows)}

How far these resolve: the pairs of one ratio spread up to ±{spread:.0%} around their median (load average
{load}, on {os.cpu_count()} cores), so a difference smaller than that is not measured here. The finer figure
is the callback's own account: with its defaults (remedies="off", sampling within 0.5% of step time) its
probes took {fraction:.2%} of step time in one fit (verdict: {verdict}). DeviceStatsMonitor reads CPU
statistics (psutil) at the start and end of every batch of a logging step; LeakDoctorCallback samples
its probes every few steps and logs its latest readings on logging steps.

No GPU was lent to the session that wrote this: the CUDA paths (a caching-allocator plateau that must be
reported as allocator_cache, a real device leak that must be a finding) have not been run on a device.
""")


if __name__ == "__main__":
    main()
