"""A PyTorch loop that also uses JAX: it registers a forward hook every step and jax.jit-compiles a new
lambda every step (run by tests/test_run.py under `leakdoctor run`, unedited): two leaks, two frameworks."""

import sys

import jax
import jax.numpy as jnp
import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 120
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randn(64, 1)
offsets = jnp.ones(8)
for step in range(steps):
    model[1].register_forward_hook(lambda module, args, out: None)  # HOOK: never removed
    jax.jit(lambda v: v + step)(offsets).block_until_ready()  # COMPILE: a new function every step
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
print(f"trained {steps} steps, loss {loss.item():.4f}")
