"""cond_to_where on real JAX functions and real optax optimizers: same numbers as the original (nested
conds, switch, conds inside jit and scan, pytrees, extra arguments), no compile per eager call, effectful
conds kept; the jaxpr scan that finds re-traced conds; the compile log that names a re-traced function."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_jax_leaks import OLD_RADAM, line_of, old_radam

from leakdoctor.integrations._jax import CompileLog, compile_listener, scan_conds
from leakdoctor.remedies.cond_to_where import cond_to_where, count_conds, rewrite_jaxpr


def nested(x: jax.Array, t: jax.Array) -> dict:
    """Conds in conds, a switch, a cond inside jit and one inside scan, over closures and pytrees."""
    y = x * 2

    def inner(z: jax.Array) -> jax.Array:
        return jax.lax.cond(z.sum() > 0, lambda q: q * y, lambda q: q - 1.0, z)

    a = jax.lax.cond(t > 0, lambda _: inner(y + 1), lambda _: y - 1, None)
    b = jax.lax.switch(jnp.int32(t) % 3, [lambda v: v + 1, lambda v: v * 3, lambda v: -v], x)
    c = jax.jit(lambda v: jax.lax.cond(v[0] > 0, jnp.sin, jnp.cos, v))(x)
    s, _ = jax.lax.scan(lambda carry, v: (jax.lax.cond(v > 0, lambda: carry + v, lambda: carry * 0.5), None), 0.0, x)
    pair = jax.lax.cond(t > 1, lambda: {"p": x, "q": (t, y)}, lambda: {"p": -x, "q": (t * 2, y + 1)})
    return {"a": a, "b": b, "c": c, "s": s, "pair": pair}


@pytest.mark.parametrize("t", [-1.0, 1.0, 2.0, 5.0])
def test_rewritten_function_matches_the_original_and_holds_no_cond(t):
    x = jnp.linspace(-1.0, 2.0, 5)
    rewritten = cond_to_where(nested)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), nested(x, t), rewritten(x, t))
    closed = jax.make_jaxpr(nested)(x, t)
    assert count_conds(closed) == 6
    assert count_conds(rewrite_jaxpr(closed)) == 0
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
                           jax.jit(nested)(x, t), jax.jit(rewritten)(x, t))


def test_gradients_and_vmap_pass_through_the_rewrite():
    x = jnp.linspace(-1.0, 2.0, 5)
    rewritten = cond_to_where(nested)
    np.testing.assert_allclose(jax.grad(lambda v: rewritten(v, 1.0)["s"])(x),
                               jax.grad(lambda v: nested(v, 1.0)["s"])(x))
    np.testing.assert_array_equal(jax.vmap(lambda t: rewritten(x, t)["b"])(jnp.arange(3.0)),
                                  jax.vmap(lambda t: nested(x, t)["b"])(jnp.arange(3.0)))


def quadratic_grads(params: dict, step: int) -> dict:
    """Gradients of a moving quadratic; every fifth step one is not finite (for apply_if_finite)."""
    bad = jnp.where(step % 5 == 4, jnp.inf, 0.0)
    return {"w": params["w"] * (1 + 0.1 * step) - 1.0 + bad, "b": params["b"] + jnp.sin(step * 1.0)}


def trajectory(update, tx, steps: int, **extra) -> list:
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))}
    state, out = tx.init(params), []
    for i in range(steps):
        updates, state = update(quadratic_grads(params, i), state, params, **extra)
        params = optax.apply_updates(params, updates)
        out.append(params)
    return out


OPTIMIZERS = {
    "old_radam": lambda: old_radam(1e-1),
    "multisteps_of_apply_if_finite": lambda: optax.MultiSteps(
        optax.apply_if_finite(optax.adam(1e-1), max_consecutive_errors=2),
        every_k_schedule=3).gradient_transformation(),
    "reduce_on_plateau": lambda: optax.chain(
        optax.sgd(1e-1), optax.contrib.reduce_on_plateau(patience=2, accumulation_size=2)),
    "mechanize": lambda: optax.contrib.mechanize(optax.sgd(1e-1)),
}


def _args(tx) -> tuple:
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))}
    return params, tx.init(params), params


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_real_optimizers_give_the_same_parameters(name):
    tx = OPTIMIZERS[name]()
    extra = {"value": jnp.float32(1.0)} if name == "reduce_on_plateau" else {}
    rewritten = cond_to_where(tx)
    assert type(rewritten) is type(tx) and rewritten.init is tx.init
    update = functools.partial(tx.update, **extra)
    assert count_conds(jax.make_jaxpr(update)(*_args(tx))) >= 1  # the optimizer really has conds
    expected = trajectory(jax.jit(tx.update), tx, 12, **extra)
    got = trajectory(jax.jit(rewritten.update), tx, 12, **extra)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), expected, got)


def test_eager_rewritten_update_stops_compiling_and_matches_the_jitted_original():
    tx = old_radam(1e-2)
    listener = compile_listener()
    rewritten = cond_to_where(tx)
    trajectory(rewritten.update, tx, 3)
    before = listener.count
    got = trajectory(rewritten.update, tx, 8)
    assert listener.count == before  # traced once per signature, each primitive compiled once
    before = listener.count
    trajectory(tx.update, tx, 4)
    assert listener.count - before >= 4  # the original compiles its cond on every eager call
    expected = trajectory(jax.jit(tx.update), tx, 8)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), expected, got)


def test_a_cond_with_side_effects_is_kept():
    def fn(x):
        return jax.lax.cond(x > 0, lambda v: (jax.debug.print("positive {}", v), v + 1)[1], lambda v: v - 1, x)

    closed = rewrite_jaxpr(jax.make_jaxpr(fn)(1.0))
    assert count_conds(closed) == 1
    assert cond_to_where(fn)(2.0) == 3.0 and cond_to_where(fn)(-2.0) == -3.0


def test_not_a_function_is_a_type_error():
    with pytest.raises(TypeError, match="cond_to_where"):
        cond_to_where(3)


def test_scan_finds_the_re_traced_cond_and_not_a_stable_one():
    tx = old_radam(1e-2)
    sites = scan_conds(tx.update, *_args(tx))
    assert len(sites) == 1 and sites[0].retraced
    assert sites[0].location.endswith(f"{OLD_RADAM.name}:{line_of('RADAM-COND', OLD_RADAM)}")
    assert sites[0].function.endswith("update_fn")
    assert any(b.startswith("_radam_update at") for b in sites[0].branches)
    stable = scan_conds(lambda x: jax.lax.cond(x > 0, jnp.sin, jnp.cos, x), 1.0)
    assert len(stable) == 1 and not stable[0].retraced


def test_compile_log_names_the_retraced_function_and_why():
    @functools.partial(jax.jit, static_argnames="scale")
    def scaled(x, scale):
        return x * scale

    scaled(jnp.ones(3), scale=0.5)
    log = CompileLog()
    log.begin()
    for i in range(3):
        scaled(jnp.ones(3), scale=1.0 + i)
    activity = log.end(3)
    assert activity.functions["jit(scaled)"][0] == 3
    miss, count = activity.repeated_miss()
    assert miss.function == "scaled" and count == 3 and "scale" in miss.reason
    assert miss.defined_at.endswith("test_jax_cond_to_where.py:" + str(scaled.__wrapped__.__code__.co_firstlineno))
    assert not jax.config.jax_explain_cache_misses  # switched back off
