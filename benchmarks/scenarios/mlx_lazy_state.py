"""An MLX loop that never evaluates the model and optimizer state (the MLX 0.16 DETR report, mlx#1271):
`optimizer.update` only records graph nodes, so each step's update is chained onto the last one's and
the graph, in native memory, grows every step while MLX's active memory stays flat. The losses are
read only at the end. Each step also prepares its batch in numpy (normalisation and noise), as a data
pipeline does, which gives the step a realistic few milliseconds."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from _harness import Truth, marker

from leakdoctor.callbacks.mlx import LeakDoctor

TRUTH = Truth(
    leak=True, cause="lazy_graph", framework="mlx", remedy="force_eval", steps=200, remedy_steps=260, start=0,
    what="optimizer.update without mx.eval(model.parameters(), optimizer.state)",
    source="mlx#1271, MLX 0.16 DETR report",
    location=(marker(__file__, "LAZY-UPDATE"),),
)


def batch(rng: np.random.Generator, raw: np.ndarray) -> tuple[mx.array, mx.array]:
    """The data pipeline's share of a step: normalise and jitter a chunk of rows, keep a batch of them."""
    rows = raw[rng.integers(0, len(raw), size=2048)]
    rows = (rows - rows.mean(axis=0)) / (rows.std(axis=0) + 1e-6) + 0.01 * rng.standard_normal(rows.shape)
    return mx.array(rows[:256, :64].astype(np.float32)), mx.array(rows[:256, 64:65].astype(np.float32))


def run(h) -> dict:
    mx.random.seed(0)
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((8192, 65))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
    mx.eval(model.parameters())
    optimizer = optim.Adam(1e-3)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    losses = []
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for _ in range(h.length):
            x, y = batch(rng, raw)
            loss, grads = loss_and_grad(model, x, y)
            optimizer.update(model, grads)  # LAZY-UPDATE
            losses.append(loss)
            doctor.step(loss=loss)
            h.tick()
    return {"final_loss": round(losses[-1].item(), 6)}
