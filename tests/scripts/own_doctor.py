"""A clean training loop that makes and steps its own leakdoctor doctor, as the README shows (run by
tests/test_run.py under `leakdoctor run`, unedited: the run joins this doctor rather than attaching a second
one). `own_doctor.py {torch|mlx|jax} STEPS`."""

import sys

kind = sys.argv[1] if len(sys.argv) > 1 else "torch"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60

if kind == "torch":
    import torch

    from leakdoctor.callbacks.torch import LeakDoctor

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    with LeakDoctor(model=model, optimizer=optimizer) as doctor:
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            doctor.step()
elif kind == "mlx":
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from leakdoctor.callbacks.mlx import LeakDoctor

    mx.random.seed(0)
    model = nn.Linear(16, 1)
    optimizer = optim.SGD(1e-2)
    x, y = mx.random.normal((64, 16)), mx.random.normal((64, 1))
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    with LeakDoctor(model=model, optimizer=optimizer) as doctor:
        for _ in range(steps):
            loss, grads = loss_and_grad(model, x, y)
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state)
            doctor.step()
else:
    import jax
    import jax.numpy as jnp
    import optax

    from leakdoctor.callbacks.jax import LeakDoctor

    tx = optax.sgd(1e-2)
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 16))
    y = jnp.sum(x[:, :4], axis=1, keepdims=True)
    params = {"w": jnp.zeros((16, 1))}
    opt_state = tx.init(params)

    @jax.jit
    def train_step(p, s):
        grads = jax.grad(lambda q: jnp.mean((x @ q["w"] - y) ** 2))(p)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    with LeakDoctor() as doctor:
        for _ in range(steps):
            params, opt_state = train_step(params, opt_state)
            doctor.step()
print(f"trained {steps} steps")
