"""Benign: a numpy training loop whose step allocates a scratch buffer of random size (0 to 40 MB, like
variable-length batches padded on the fly) that lives until the next step: resident memory jumps up and
down by tens of megabytes from step to step around a flat level."""

from __future__ import annotations

import numpy as np
from _harness import Truth

from leakdoctor import LeakDoctor

TRUTH = Truth(
    leak=False, cause=None, framework="python/numpy", steps=300, start=0,
    what="a scratch buffer of random size (up to 40 MB) kept until the next step",
    source="variable-length batches",
)


def run(h) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 256))
    w = rng.standard_normal((256, 256)) * 0.05
    scratch = None
    with h.doctor(LeakDoctor) as doctor:
        for _ in range(h.length):
            hidden = np.tanh(x @ w)
            w -= 1e-3 * (x.T @ (hidden * (1 - hidden ** 2))) / len(x)
            scratch = np.ones(int(rng.integers(1, 5_000_000)))  # replaced, so freed, at the next step
            doctor.step()
            h.tick()
    del scratch
