"""Benign: a jitted JAX step fed batches padded to one of four bucket lengths, drawn at random. Each
new length compiles once and is cached; the cache fills over the first tens of steps (the last bucket
can first appear well after the warm-up) and then stays as it is."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _harness import Truth

from leakdoctor.callbacks.flax import LeakDoctor

BUCKETS = (32, 64, 96, 128)
TRUTH = Truth(
    leak=False, cause=None, framework="jax", steps=300, start=0,
    what="a jit cache of four padded sequence lengths that fills, then plateaus",
    source="bucketing, the usual fix for retracing",
)


@jax.jit
def train_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    loss = jnp.mean(jnp.tanh(x @ w) ** 2)
    return w - 1e-3 * jax.grad(lambda v: jnp.mean(jnp.tanh(x @ v) ** 2))(w), loss


def run(h) -> None:
    rng = np.random.default_rng(0)
    # the last bucket is rare: it first comes after the warm-up, as long batches do in real data
    lengths = rng.choice(BUCKETS, size=h.length, p=(0.4, 0.3, 0.27, 0.03))
    w = jnp.eye(64) * 0.5
    data = jax.random.normal(jax.random.PRNGKey(0), (max(BUCKETS) * 8, 64))
    with h.doctor(LeakDoctor) as doctor:
        for length in lengths:
            w, loss = train_step(w, data[: int(length) * 8])
            loss.block_until_ready()
            doctor.step()
            h.tick()
    return {"first_seen": {int(b): int(np.argmax(lengths == b)) for b in BUCKETS}}
