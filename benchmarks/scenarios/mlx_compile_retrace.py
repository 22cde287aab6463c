"""An `mx.compile`d MLX train step fed a longer input every step (growing context): each new shape traces
and compiles the function again, and every compiled graph is kept."""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from _harness import Truth, marker

from leakdoctor.callbacks.mlx import LeakDoctor

START = 30
TRUTH = Truth(
    leak=True, cause="compile_cache", framework="mlx", steps=400, start=START,
    what="mx.compile called with a new input shape every step", source="MLX compile docs (shapeless=True)",
    location=(marker(__file__, "COMPILED"),),
)


def run(h) -> None:
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    mx.eval(model.parameters())
    optimizer = optim.SGD(1e-2)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)  # COMPILED
    def train_step(x: mx.array, y: mx.array) -> mx.array:
        loss, grads = loss_and_grad(model, x, y)
        optimizer.update(model, grads)
        return loss

    data = mx.random.normal((4096, 16))
    mx.eval(data)
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for step in range(h.length):
            rows = 64 + max(0, step - START)  # the same shape until the leak starts, then one longer each step
            x = data[:rows]
            loss = train_step(x, x[:, :1])
            mx.eval(state, loss)
            doctor.step()
            h.tick()
