"""A jitted JAX loop that keeps every step's activations in a Python list (to plot them later): device
arrays accumulate, one 256 KiB array a step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from _harness import Truth, marker

from leakdoctor.callbacks.flax import LeakDoctor

START = 40
TRUTH = Truth(
    leak=True, cause="device_arrays", framework="jax", steps=160, start=START,
    what="history.append(activations) of a jitted step", source="common user bug",
    location=(marker(__file__, "KEEP"),),
)


@jax.jit
def train_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    hidden = jnp.tanh(x @ w)
    return w - 1e-4 * (x.T @ hidden) / len(x), hidden @ w


def run(h) -> None:
    x = jax.random.normal(jax.random.PRNGKey(2), (512, 256))
    w = jnp.eye(256) * 0.5
    history = []
    with h.doctor(LeakDoctor) as doctor:
        for step in range(h.length):
            w, activations = train_step(w, x)
            if step >= START:
                history.append(activations)  # KEEP
            doctor.step()
            h.tick()
