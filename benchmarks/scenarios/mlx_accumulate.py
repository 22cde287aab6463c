"""An MLX loop that evaluates its state every step but sums the loss into a running total that is never
evaluated (mlx-lm-lora PR #47): `total = total + loss` keeps every step's inputs alive, so active memory
and resident memory grow. The total is handed to the doctor (`doctor.step(total=total)`), as the MLX
doctor's documentation says, so force_eval can evaluate it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from _harness import Truth, marker

from leakdoctor.callbacks.mlx import LeakDoctor

START = 40
TRUTH = Truth(
    leak=True, cause="lazy_graph", framework="mlx", remedy="force_eval", steps=160, remedy_steps=220,
    start=START,
    what="total = total + loss, never evaluated", source="mlx-lm-lora PR #47",
    location=(marker(__file__, "ACCUMULATE"),),
)


def run(h) -> dict:
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    mx.eval(model.parameters())
    optimizer = optim.Adam(1e-3)
    x, y = mx.random.normal((4096, 64)), mx.random.randint(0, 10, (4096,))
    mx.eval(x, y)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.cross_entropy(m(a), b, reduction="mean"))
    total = mx.array(0.0)
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for step in range(h.length):
            rows = slice(step * 64 % 4096, step * 64 % 4096 + 64)
            loss, grads = loss_and_grad(model, x[rows], y[rows])
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state)
            if step >= START:
                total = total + loss  # ACCUMULATE
            doctor.step(total=total)
            h.tick()
    return {"total": round(total.item(), 4)}
