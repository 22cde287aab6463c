"""The old optax RAdam (optax#969) in a Flax TrainState loop: gradients jitted, the optimizer applied
eagerly by `state.apply_gradients`, so its `lax.cond` over closures compiles on every step and every
compiled executable is kept: resident memory grows about a megabyte a step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from _harness import Truth, marker
from flax import linen
from flax.training import train_state

from leakdoctor.callbacks.flax import LeakDoctor
from leakdoctor.examples import old_radam as old_radam_module
from leakdoctor.examples.old_radam import old_radam

TRUTH = Truth(
    leak=True, cause="compile_cache", framework="jax/flax/optax", remedy="cond_to_where", steps=75,
    remedy_steps=120, start=0,
    what="optax<=0.2.2 RAdam's lax.cond applied outside jit", source="optax#969, jax#12719",
    location=(marker(old_radam_module.__file__, "RADAM-COND"),),
)


@jax.jit
def loss_and_grads(state: train_state.TrainState, x: jax.Array, y: jax.Array):
    return jax.value_and_grad(lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(state.params)


def run(h) -> dict:
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
    y = jnp.sin(x).sum(1, keepdims=True)
    model = linen.Dense(1)
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.PRNGKey(0), x),
                                          tx=old_radam(1e-2))
    losses = []
    with h.doctor(LeakDoctor) as doctor:
        for _ in range(h.length):
            loss, grads = loss_and_grads(state, x, y)
            state = state.apply_gradients(grads=grads)
            losses.append(float(loss))
            state = doctor.step(state)
            h.tick()
    return {"final_loss": round(losses[-1], 6)}
