"""An Equinox stack of 16 Linear(1024, 1024) layers built with `eqx.filter_vmap` in float32, then cast to
bfloat16 (equinox#673): the whole stack exists in float32, with the random-number temporaries, before the
cast: a peak at initialisation several times the final model's size. Then a clean jitted fine-tuning loop.
Not a leak: nothing grows while training; the init peak is what matters. In the remedy run the stack is
built with `leakdoctor.remedies.low_precision_init` (layer by layer, cast at once), which the user calls:
the doctor cannot rebuild a model that already exists."""

from __future__ import annotations

import ctypes

import equinox as eqx
import jax
import jax.numpy as jnp
from _harness import Truth

from leakdoctor.callbacks.flax import LeakDoctor
from leakdoctor.remedies.low_precision_init import estimate_init_bytes, low_precision_init

LAYERS, WIDTH = 16, 1024
TRUTH = Truth(
    leak=False, cause=None, framework="equinox", remedy="low_precision_init", steps=100, start=0,
    what="eqx.filter_vmap over 16 keys in float32 then a cast to bfloat16, then a clean training loop",
    source="equinox#673",
)


def status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field))


def make(key: jax.Array) -> eqx.nn.Linear:
    return eqx.nn.Linear(WIDTH, WIDTH, key=key)


def build(way: str, keys: jax.Array) -> eqx.nn.Linear:
    if way == "low_precision_init":
        return low_precision_init(make, keys, dtype=jnp.bfloat16)
    stack = eqx.filter_vmap(make)(keys)
    return jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, stack)


def run(h) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(0), LAYERS)
    way = "low_precision_init" if h.remedies == "all" else "filter_vmap then cast"
    ctypes.CDLL(None).malloc_trim(0)
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # reset the resident high-water mark
    stack = jax.block_until_ready(build(way, keys))
    peak = status("VmHWM") - base
    estimate = estimate_init_bytes(make, keys, dtype=jnp.bfloat16)

    # fine-tune a float32 copy of the first layer on top of the frozen stack's second: a step of a few ms
    head = jax.tree_util.tree_map(lambda a: a[0].astype(jnp.float32) if eqx.is_array(a) else a, stack)
    frozen = jax.tree_util.tree_map(lambda a: a[1].astype(jnp.float32) if eqx.is_array(a) else a, stack)

    @eqx.filter_jit
    def train_step(head, x):
        loss = lambda m: jnp.mean(jax.vmap(frozen)(jnp.tanh(jax.vmap(m)(x))) ** 2)  # noqa: E731
        value, grads = eqx.filter_value_and_grad(loss)(head)
        return eqx.apply_updates(head, jax.tree_util.tree_map(lambda g: -1e-3 * g, grads)), value

    x = jax.random.normal(jax.random.PRNGKey(1), (8, WIDTH))
    with h.doctor(LeakDoctor) as doctor:
        for _ in range(h.length):
            head, value = train_step(head, x)
            value.block_until_ready()
            doctor.step()
            h.tick()
    estimated = estimate.layerwise_peak_bytes if h.remedies == "all" else estimate.naive_peak_bytes
    return {"init": way, "init_peak_bytes": peak, "preflight_estimate_bytes": estimated}
