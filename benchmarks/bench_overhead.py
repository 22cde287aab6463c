"""Per-step overhead of the always-on part of LeakDoctor on a loop of ~5 ms steps (a numpy MLP, one
BLAS thread), as the ratio of this process's CPU time with and without the doctor in one run (on a
shared machine wall time mostly measures the other processes): back-to-back blocks of steps,
alternating which goes first, median of the pairs. Also the doctor's own account of its time
(summary overhead), which counts only the sampled steps, and the sampling stride it chose."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, paired_ratio, table, write_section  # noqa: E402

from leakdoctor import LeakDoctor  # noqa: E402
from leakdoctor.examples.numpy_cycles import MLP  # noqa: E402

BLOCK = 60
PAIRS = 25


def step_of(hidden: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256))
    y = x[:, :10].argmax(axis=1)
    model = MLP(hidden=hidden)
    return lambda: model.step(x, y)


def measure(hidden: int) -> dict[str, float]:
    step = step_of(hidden)
    doctor = LeakDoctor(verbose=False)

    def block(with_doctor: bool) -> float:
        start = time.process_time()
        for _ in range(BLOCK):
            step()
            if with_doctor:
                doctor.step()
        return time.process_time() - start

    for _ in range(2 * BLOCK):  # warm up both the model and the doctor (past its warm-up steps)
        step()
        doctor.step()
    ratio, ratios = paired_ratio(lambda: block(False), lambda: block(True), PAIRS)
    summary = doctor.finish()
    return {
        "step_ms": 1e3 * np.median([block(False) for _ in range(5)]) / BLOCK,
        "ratio": ratio,
        "q1": float(np.percentile(ratios, 25)),
        "q3": float(np.percentile(ratios, 75)),
        "self_reported": summary.overhead["fraction_of_step_time"],
        "stride": summary.settings["sample_stride"],
        "findings": len(summary.findings),
    }


def main() -> None:
    rows = []
    for hidden in (384, 128):
        m = measure(hidden)
        rows.append([f"{m['step_ms']:.2f} ms", f"{(m['ratio'] - 1) * 100:+.2f}%",
                     f"{(m['q1'] - 1) * 100:+.2f}% .. {(m['q3'] - 1) * 100:+.2f}%",
                     f"{m['self_reported'] * 100:.2f}%", m["stride"], m["findings"]])
        print(rows[-1], flush=True)
    write_section("01_overhead", f"""
## Overhead of the always-on doctor (issue #2)

`.venv/bin/python benchmarks/run.py overhead` on {machine()}.
A numpy MLP training step (batch 256, hidden width varied to change the step time), {PAIRS} pairs of
{BLOCK}-step blocks with and without `LeakDoctor()` (defaults: remedies off, overhead budget 0.5%),
alternating which goes first; the ratio is the median over pairs. The doctor's own account is
`summary.overhead["fraction_of_step_time"]` (time inside `step()`, investigations excluded).
Target: under 1% at ~5 ms steps. The paired ratio resolves only the spread of its pairs (the interquartile
range: this machine's noise from block to block); the doctor's own account, which that noise does not
blur, is the figure to read against the target.

{table(["step time", "CPU-time overhead (median)", "interquartile range", "doctor's own account",
        "sample stride", "findings"], rows)}
""")


if __name__ == "__main__":
    main()
