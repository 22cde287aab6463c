"""MLX: what cap_cache costs on a loop whose buffer cache grows (varying shapes, raised cache limit), and
what the doctor costs on a correct loop of 500 steps.

Paired runs (benchmarks.common.paired_ratio), so drift of the machine hits both sides of each pair
alike, timed in CPU time of this process (time.process_time): on a shared machine wall time mostly
measures the other processes, while the costs compared here (allocations, the doctor's probes) are CPU
work. Each figure is the median ratio of the pairs, with the middle half of the pairs (their noise).

Run: .venv/bin/python benchmarks/run.py mlx
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, paired_ratio, table, write_section  # noqa: E402

from leakdoctor.callbacks.mlx import LeakDoctor  # noqa: E402
from leakdoctor.integrations._mlx import CACHE  # noqa: E402
from leakdoctor.remedies._base import RemedyContext  # noqa: E402
from leakdoctor.remedies.cap_cache import CapCache  # noqa: E402
from leakdoctor.reporting.summary import Finding  # noqa: E402

PAIRS = 5
RAISED = 2**30


def compare(baseline: Callable[[], float], other: Callable[[], float]) -> str:
    """'0.998 (middle half of pairs 0.97-1.03)': the median of other / baseline over the pairs, and
    the spread of the pairs, which is the noise of the machine."""
    ratio, ratios = paired_ratio(baseline, other, PAIRS)
    low, _, high = statistics.quantiles(ratios, n=4)
    return f"{ratio:.3f} (middle half of pairs {low:.3f}-{high:.3f})"


def mlp(inputs: int, hidden: int) -> nn.Module:
    model = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 1))
    mx.eval(model.parameters())
    return model


class VaryingShapes:
    """The cache-growth loop of tests/test_mlx.py: a random sequence length every step."""

    def __init__(self, steps: int = 100) -> None:
        mx.random.seed(0)
        self.model, self.opt = mlp(16, 64), optim.Adam(1e-3)
        self.loss_and_grad = nn.value_and_grad(self.model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
        self.sequences = mx.random.normal((4, 256, 16))
        mx.eval(self.sequences)
        self.lengths = [int(n) for n in np.random.default_rng(0).integers(8, 256, size=steps)]

    def run(self, clear: bool = False) -> float:
        """CPU seconds for one pass over the lengths (clearing the cache after every step if asked)."""
        start = time.process_time()
        for length in self.lengths:
            x = self.sequences[:, :length]
            loss, grads = self.loss_and_grad(self.model, x, x[..., :1])
            self.opt.update(self.model, grads)
            mx.eval(self.model.parameters(), self.opt.state, loss)
            if clear:
                mx.clear_cache()
        return time.process_time() - start

    def warm_run(self, limit: int, clear: bool = False) -> float:
        """A pass with this cache limit after a warm-up pass over the same lengths (so an uncapped cache
        already holds every size, as it does in a long run)."""
        mx.set_cache_limit(limit)
        self.run(clear)
        return self.run(clear)


def cache_section() -> str:
    """Step time with the cap that cap_cache derives vs the raised limit (and vs clearing every step)."""
    loop = VaryingShapes()
    loop.warm_run(RAISED)
    finding = Finding("allocator_cache", CACHE, 0, 0, 0.0, "bytes", None, "", "", benign=True, reclaimed_by="clear_cache")
    detail = CapCache().apply(RemedyContext(finding, {}))
    cap = mx.set_cache_limit(RAISED)
    held = {}
    for name, limit in (("raised", RAISED), ("capped", cap)):
        loop.warm_run(limit)
        held[name] = mx.get_cache_memory()
    step_ms = loop.warm_run(RAISED) / len(loop.lengths) * 1e3
    capped = compare(lambda: loop.warm_run(RAISED), lambda: loop.warm_run(cap))
    cleared = compare(lambda: loop.warm_run(RAISED), lambda: loop.warm_run(RAISED, clear=True))
    return (
        f"### MLX: cap_cache on a growing buffer cache\n\n"
        f"Loop: an MLP (16-64-64-1, Adam) on 4 sequences of a random length (8 to 255) every step, cache "
        f"limit raised to 1 GiB, {len(loop.lengths)} steps per run, ~{step_ms:.1f} ms of CPU per step. "
        f"cap_cache derived: {detail}. CPU time per step against the raised limit, {PAIRS} pairs, each run "
        f"after a warm-up pass over the same lengths.\n\n"
        + table(["configuration", "cache memory after a run", "step time vs raised limit"], [
            ["raised limit (1 GiB), no remedy", f"{held['raised'] / 2**20:.1f} MiB", "1.000"],
            [f"cap_cache ({cap / 2**20:.1f} MiB)", f"{held['capped'] / 2**20:.1f} MiB", capped],
            ["mx.clear_cache() every step (for comparison)", "0", cleared],
        ])
    )


def correct_loop(model: nn.Module, opt: optim.Optimizer, data: tuple, steps: int, doctor: LeakDoctor | None) -> None:
    x, y = data
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    for i in range(steps):
        batch = slice(i * 32 % 1024, i * 32 % 1024 + 32)
        loss, grads = loss_and_grad(model, x[batch], y[batch])
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        if doctor is not None:
            doctor.step()


def overhead_section(steps: int = 500) -> str:
    """The correct MLP loop of tests/test_mlx.py, with and without the doctor (remedies='safe'); the
    doctor is built before and finished after the timed loop."""
    mx.random.seed(0)
    model, opt = mlp(64, 128), optim.Adam(1e-3)
    data = (mx.random.normal((1024, 64)), mx.random.normal((1024, 1)))
    mx.eval(*data)
    fractions, findings = [], []

    def plain() -> float:
        start = time.process_time()
        correct_loop(model, opt, data, steps, None)
        return time.process_time() - start

    def doctored() -> float:
        doctor = LeakDoctor(model=model, optimizer=opt, remedies="safe", verbose=False)
        start = time.process_time()
        correct_loop(model, opt, data, steps, doctor)
        elapsed = time.process_time() - start
        summary = doctor.finish()
        fractions.append(summary.overhead["fraction_of_step_time"])
        findings.append(len(summary.findings))
        return elapsed

    step_ms = plain() / steps * 1e3
    ratio = compare(plain, doctored)
    return (
        f"### MLX: doctor overhead on a correct loop\n\n"
        f"Loop: an MLP (64-128-128-1, Adam, batch 32) evaluated every step, {steps} steps per run, "
        f"~{step_ms:.2f} ms of CPU per step; doctor with remedies='safe', built before and finished after "
        f"the timed loop; {PAIRS} pairs. The engine's own account is the time spent inside doctor.step() "
        f"over the user's step time, which machine noise does not blur.\n\n"
        + table(["measure", "value"], [
            ["CPU time per step, with / without the doctor", ratio],
            ["time inside doctor.step(), fraction of step time (median of runs)",
             f"{statistics.median(fractions):.2%}"],
            ["findings in the correct runs", f"{sum(findings)} in {len(findings)} runs"],
        ])
    )


def main() -> None:
    sections = [cache_section(), overhead_section()]
    write_section("mlx", f"## MLX\n\nMeasured on: {machine()}, mlx {mx.__version__} (CPU). "
                  f"Command: `.venv/bin/python benchmarks/run.py mlx`.\n\n" + "\n\n".join(sections))


if __name__ == "__main__":
    main()
