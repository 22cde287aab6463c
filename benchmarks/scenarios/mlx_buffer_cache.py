"""Benign, but growing: sequences of a random length every step with MLX's cache limit raised to 1 GiB
(mlx-lm PR #986). Every new length leaves buffers of new sizes in MLX's buffer cache, which keeps them
for reuse: cache memory and resident memory grow while active memory stays flat. Not a leak (the cache
is reused and bounded by its limit), so the right report is a benign allocator_cache; with remedies,
cap_cache bounds it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from _harness import Truth

from leakdoctor.callbacks.mlx import LeakDoctor

TRUTH = Truth(
    leak=False, cause="allocator_cache", framework="mlx", remedy="cap_cache", steps=260, start=0,
    what="MLX's buffer cache filling with buffers of many sizes (cache limit 1 GiB)", source="mlx-lm PR #986",
)


def run(h) -> dict:
    previous = mx.set_cache_limit(2**30)
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    mx.eval(model.parameters())
    optimizer = optim.Adam(1e-3)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    sequences = mx.random.normal((4, 256, 16))
    mx.eval(sequences)
    lengths = np.random.default_rng(0).integers(8, 256, size=h.length)
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for length in lengths:
            x = sequences[:, : int(length)]
            loss, grads = loss_and_grad(model, x, x[..., :1])
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state, loss)
            doctor.step()
            h.tick()
    return {"cache_limit_after": mx.set_cache_limit(previous)}
