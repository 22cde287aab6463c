"""An MLX loop that evaluates each batch (`mx.eval(xb, yb)`) but never the parameters after
optimizer.update: the lazy graph chains across steps. Run by tests/test_run_compiled.py under
`leakdoctor run --step-on mlx.core:eval`, where each return of mx.eval is a step (and force_eval, the
remedy, evaluates the state with mx.eval itself)."""

import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
mx.random.seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = optim.Adam(1e-3)
x, y = mx.random.normal((512, 64)), mx.random.normal((512, 1))
loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
for step in range(steps):
    batch = slice(step * 32 % 512, step * 32 % 512 + 32)
    xb, yb = x[batch], y[batch]
    mx.eval(xb, yb)  # the batch only: a step under --step-on mlx.core:eval
    loss, grads = loss_and_grad(model, xb, yb)
    optimizer.update(model, grads)  # LAZY: the new state is never evaluated
print(f"trained {steps} steps")
