"""Rectified Adam as optax wrote it up to 0.2.2 (optax#969): the update branches on the step count with
`jax.lax.cond` over closures made anew on every call. Jitted, that is fine; run eagerly (an optimizer
applied outside jit, as `TrainState.apply_gradients` or a bare optax loop do), every call traces the
branches again and compiles a new `cond`, and every executable is kept (jax#12719). The optimizer of
the JAX tests, benchmarks and the flax_radam scenario; findings point at its `# RADAM-COND` line."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class ScaleByRAdamState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def scale_by_radam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   threshold: float = 5.0) -> optax.GradientTransformation:
    ro_inf = 2.0 / (1 - b2) - 1

    def _radam_update(args: Any) -> Any:
        ro, mu_hat, nu_hat = args
        r = jnp.sqrt((ro - 4) * (ro - 2) * ro_inf / ((ro_inf - 4) * (ro_inf - 2) * ro))
        return jax.tree_util.tree_map(lambda m, v: r * m / (jnp.sqrt(v) + eps), mu_hat, nu_hat)

    def init_fn(params: Any) -> ScaleByRAdamState:
        zeros = functools.partial(jax.tree_util.tree_map, jnp.zeros_like)
        return ScaleByRAdamState(jnp.zeros([], jnp.int32), zeros(params), zeros(params))

    def update_fn(updates: Any, state: ScaleByRAdamState, params: Any = None) -> Any:
        mu = jax.tree_util.tree_map(lambda g, t: (1 - b1) * g + b1 * t, updates, state.mu)
        nu = jax.tree_util.tree_map(lambda g, t: (1 - b2) * g ** 2 + b2 * t, updates, state.nu)
        count = state.count + 1
        b2t = b2 ** count
        ro = ro_inf - 2 * count * b2t / (1 - b2t)
        mu_hat = jax.tree_util.tree_map(lambda t: t / (1 - b1 ** count), mu)
        nu_hat = jax.tree_util.tree_map(lambda t: t / (1 - b2 ** count), nu)
        updates = jax.lax.cond(ro >= threshold, _radam_update, lambda _: mu_hat, (ro, mu_hat, nu_hat))  # RADAM-COND
        return updates, ScaleByRAdamState(count, mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


def old_radam(learning_rate: float) -> optax.GradientTransformation:
    return optax.chain(scale_by_radam(), optax.scale(-learning_rate))
