"""An MLX MLP whose training loop calls optimizer.update but never evaluates the parameters and the
optimizer state (the MLX 0.16 DETR report, mlx#114): each step's lazy graph chains onto the last, so
resident memory grows while MLX's active memory stays flat. leakdoctor names it lazy_graph and, with
remedies="safe", evaluates the state after every step (force_eval), which changes no result."""

from __future__ import annotations

from typing import Any


def train(steps: int = 1500, **doctor_args: Any):
    """Train for `steps` steps under leakdoctor's MLX doctor; return its summary."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from leakdoctor.callbacks.mlx import LeakDoctor

    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = optim.Adam(1e-3)
    x, y = mx.random.normal((1024, 64)), mx.random.normal((1024, 1))
    mx.eval(model.parameters(), x, y)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    with LeakDoctor(model=model, optimizer=optimizer, remedies="safe", **doctor_args) as doctor:
        for step in range(steps):
            batch = slice(step * 32 % 1024, step * 32 % 1024 + 32)
            loss, grads = loss_and_grad(model, x[batch], y[batch])
            optimizer.update(model, grads)  # the state is updated lazily, and never evaluated
            doctor.step(loss=loss)
    return doctor.summary
