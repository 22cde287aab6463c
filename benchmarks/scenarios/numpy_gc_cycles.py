"""A numpy MLP trained with Python's cyclic garbage collector switched off for speed (a common trick in
hot loops). Each step logs a record whose callback refers back to it: garbage only the cyclic collector
frees, and it holds the step's activations, so memory grows until something collects."""

from __future__ import annotations

import gc

import numpy as np
from _harness import Truth, marker

from leakdoctor import LeakDoctor

START = 40
TRUTH = Truth(
    leak=True, cause="python_objects", framework="python/numpy", remedy="gc_collect", steps=160,
    remedy_steps=220, start=START,
    what="gc.disable() and a per-step record in a reference cycle holding the activations",
    source="gc.disable() in hot loops", location=(marker(__file__, "CYCLE"), marker(__file__, "RECORD")),
)


class StepRecord:
    def __init__(self, activations: np.ndarray, loss: float) -> None:
        self.activations = activations
        self.loss = loss
        self.on_flush = lambda: print(self.loss)  # CYCLE


def run(h) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 256))
    y = x[:, :10].argmax(axis=1)
    w1 = rng.standard_normal((256, 512)) * np.sqrt(2 / 256)
    w2 = rng.standard_normal((512, 10)) * np.sqrt(2 / 512)
    was_enabled = gc.isenabled()
    try:
        with h.doctor(LeakDoctor) as doctor:
            for step in range(h.length):
                if step == START:
                    gc.disable()
                hidden = np.maximum(x @ w1, 0.0)
                logits = hidden @ w2
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
                p[np.arange(len(y)), y] -= 1.0
                grad_hidden = (p @ w2.T) * (hidden > 0)
                w2 -= 0.05 * (hidden.T @ p) / len(y)
                w1 -= 0.05 * (x.T @ grad_hidden) / len(y)
                StepRecord(hidden, loss)  # RECORD
                doctor.step()
                h.tick()
    finally:
        if was_enabled:
            gc.enable()
    return {"final_loss": round(loss, 6)}
