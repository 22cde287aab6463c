"""A numpy MLP trained with the cyclic garbage collector switched off for speed (a common trick in hot
loops). Each step logs a record whose callback refers back to the record: garbage, but garbage that only
the cyclic collector frees, and it holds the step's activations. Memory grows by ~1 MiB a step until a
periodic gc.collect() (leakdoctor's gc_collect remedy) takes it back."""

from __future__ import annotations

import gc
from typing import Any, Callable

import numpy as np

class StepRecord:
    def __init__(self, activations: np.ndarray, loss: float) -> None:
        self.activations = activations
        self.loss = loss
        self.on_flush = lambda: print(self.loss)  # the closure refers back to the record: a cycle


class MLP:
    """Two-layer ReLU network, softmax cross-entropy, plain SGD."""

    def __init__(self, inputs: int = 256, hidden: int = 512, classes: int = 10, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((inputs, hidden)) * np.sqrt(2 / inputs)
        self.w2 = rng.standard_normal((hidden, classes)) * np.sqrt(2 / hidden)

    def step(self, x: np.ndarray, y: np.ndarray, lr: float = 0.05) -> tuple[float, np.ndarray]:
        h = np.maximum(x @ self.w1, 0.0)
        logits = h @ self.w2
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        p[np.arange(len(y)), y] -= 1.0
        grad_h = (p @ self.w2.T) * (h > 0)
        self.w2 -= lr * (h.T @ p) / len(y)
        self.w1 -= lr * (x.T @ grad_h) / len(y)
        return loss, h


def run(step_hook: Callable[[], None], steps: int = 400, seed: int = 0) -> list[float]:
    """Train for `steps` steps on synthetic data, calling `step_hook()` after each; return the losses."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 256))
    y = (x[:, :10].argmax(axis=1)).astype(np.int64)
    model = MLP(seed=seed)
    losses = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(steps):
            loss, activations = model.step(x, y)
            StepRecord(activations, loss)
            losses.append(loss)
            step_hook()
    finally:
        if enabled:
            gc.enable()
    return losses


def train(steps: int = 400, **doctor_args: Any):
    """Train under leakdoctor with the safe remedies; return its summary."""
    from leakdoctor import LeakDoctor

    with LeakDoctor(remedies="safe", **doctor_args) as doctor:
        run(doctor.step, steps)
    return doctor.summary
