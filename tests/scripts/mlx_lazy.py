"""An MLX loop that updates its parameters and never evaluates them: each step's lazy graph chains onto
the last (run by tests/test_run.py under `leakdoctor run`, unedited)."""

import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
mx.random.seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = optim.Adam(1e-3)
x, y = mx.random.normal((512, 64)), mx.random.normal((512, 1))
mx.eval(model.parameters(), x, y)
loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
for step in range(steps):
    batch = slice(step * 32 % 512, step * 32 % 512 + 32)
    loss, grads = loss_and_grad(model, x[batch], y[batch])
    optimizer.update(model, grads)  # LAZY: the new state is never evaluated
print(f"trained {steps} steps")
