"""A bare optax loop with the old RAdam (its update branches with an un-jitted lax.cond, optax#969),
the gradients jitted and the update run eagerly (run by tests/test_run.py under `leakdoctor run`,
unedited)."""

import sys

import jax
import jax.numpy as jnp
import optax

from leakdoctor.examples.old_radam import old_radam

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
x = jax.random.normal(jax.random.PRNGKey(0), (64, 8))
y = x[:, :1] * 0.5
params = {"w": jnp.zeros((8, 1)), "b": jnp.zeros((1,))}
grads_of = jax.jit(jax.grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2)))
tx = old_radam(1e-2)
opt_state = tx.init(params)
for _ in range(steps):
    updates, opt_state = tx.update(grads_of(params), opt_state, params)  # UPDATE: eager
    params = optax.apply_updates(params, updates)
print(f"trained {steps} steps")
