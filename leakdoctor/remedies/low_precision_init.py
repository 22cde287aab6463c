"""low_precision_init: build a stack of layers in low precision without ever holding the whole stack
in full precision; and `estimate_init_bytes`, a preflight that tells the peak before anything runs.

The usual way to build a stack of identical layers (Equinox's `filter_vmap` over keys, equinox#673) then
cast it to float16/bfloat16 holds every layer in float32 at once, plus the random-number temporaries of
the whole stack, plus the cast copy: a peak several times the size of the result. Here each layer is
built on its own, cast at once and written into a preallocated stacked buffer of the target dtype (in
place: the buffer is donated), so full-precision weights of only one layer exist at any moment.

    stack = low_precision_init(lambda key: eqx.nn.Linear(1024, 1024, key=key), keys, dtype=jnp.float16)
    print(estimate_init_bytes(make_layer, keys, dtype=jnp.float16))   # before running either

`fn` returns one layer: an Equinox module or any pytree of arrays; array arguments carry a leading layer
axis (like `vmap`), other arguments are passed to every call. Floating-point arrays are cast to `dtype`;
integer, boolean and key arrays keep theirs; non-array leaves (activation functions) are taken from the
first layer. The result has the structure `filter_vmap(fn)(*args)` has, and the same values, cast.

Not a remedy the doctor applies during training (it cannot rebuild a model already built): a tool to
use at construction, listed here with the other remedies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from leakdoctor._base.units import format_value
from leakdoctor.integrations._process import malloc_trim


def low_precision_init(fn: Callable[..., Any], *args: Any, dtype: Any) -> Any:
    """Stack `fn(*args[i])` over the leading axis of the array arguments, floating arrays in `dtype`,
    holding one full-precision layer at a time."""
    import jax
    import jax.numpy as jnp

    target = _float_dtype(dtype)
    layers, arg_leaves, arg_tree = _layer_args(fn, args)
    trim = malloc_trim() or (lambda: None)
    indices = [jnp.asarray(i, jnp.int32) for i in range(layers)]  # array indices: one compile for all
    first = fn(*_layer(arg_leaves, arg_tree, indices[0]))
    leaves, tree = jax.tree_util.tree_flatten(first)
    buffers = [jnp.zeros((layers, *x.shape), _cast_dtype(x.dtype, target)) if _is_array(x) else x for x in leaves]
    for i, index in enumerate(indices):
        layer = fn(*_layer(arg_leaves, arg_tree, index)) if i else first
        first = None
        parts, layer_tree = jax.tree_util.tree_flatten(layer)
        del layer
        if layer_tree != tree:
            raise ValueError(f"low_precision_init: layer {i} has structure {layer_tree}, layer 0 had {tree}")
        buffers = [_write(b, x, index) if _is_array(x) else b for b, x in zip(buffers, parts)]
        del parts
        trim()  # the freed full-precision layer goes back to the OS, not to the allocator's free lists
    return jax.tree_util.tree_unflatten(tree, buffers)


@functools.cache
def _writer() -> Callable[[Any, Any, Any], Any]:
    import jax

    def write(buffer: Any, layer: Any, index: Any) -> Any:
        return jax.lax.dynamic_update_index_in_dim(buffer, layer.astype(buffer.dtype), index, 0)

    return jax.jit(write, donate_argnums=0)


def _write(buffer: Any, layer: Any, index: Any) -> Any:
    return _writer()(buffer, layer, index)


def _float_dtype(dtype: Any) -> Any:
    import jax.numpy as jnp

    try:
        target = jnp.dtype(dtype)
    except TypeError:
        target = None
    if target is None or not jnp.issubdtype(target, jnp.floating):
        raise ValueError(f"dtype={dtype!r}: expected a floating dtype such as jnp.float16 or jnp.bfloat16")
    return target


def _cast_dtype(dtype: Any, target: Any) -> Any:
    import jax.numpy as jnp

    return target if jnp.issubdtype(dtype, jnp.floating) else dtype


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _layer_args(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[int, list[Any], Any]:
    """(number of layers, argument leaves, argument tree), checking that array arguments agree."""
    import jax

    if not callable(fn):
        raise ValueError(f"fn={fn!r}: expected a function that builds one layer")
    leaves, tree = jax.tree_util.tree_flatten(args)
    sizes = {x.shape[0] for x in leaves if _is_array(x) and x.ndim}
    if len(sizes) != 1:
        found = [tuple(x.shape) for x in leaves if _is_array(x)]
        raise ValueError(f"low_precision_init: the array arguments must share one leading layer axis, got "
                         f"shapes {found or 'no arrays'} (e.g. keys = jax.random.split(key, layers))")
    return sizes.pop(), leaves, tree


def _layer(leaves: Sequence[Any], tree: Any, index: Any) -> Any:
    """The arguments of one layer: row `index` (an array, so that every row shares one compiled slice)
    of each array with a layer axis."""
    import jax

    def row(x: Any) -> Any:
        return jax.lax.dynamic_index_in_dim(x, index, 0, keepdims=False) if _is_array(x) and x.ndim else x

    return jax.tree_util.tree_unflatten(tree, [row(x) for x in leaves])


# --- the preflight ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class InitEstimate:
    """Bytes of a stacked init, estimated without allocating: the stack at the dtypes `fn` creates, the
    stack after the cast, and the peak of each way to build it (above what was allocated before)."""

    layers: int
    full_bytes: int
    target_bytes: int
    naive_peak_bytes: int
    layerwise_peak_bytes: int

    def __str__(self) -> str:
        b = functools.partial(format_value, unit="bytes")
        return (f"{self.layers} layers: {b(self.full_bytes)} as built, {b(self.target_bytes)} after the cast; "
                f"peak {b(self.naive_peak_bytes)} building the whole stack then casting, "
                f"{b(self.layerwise_peak_bytes)} with low_precision_init "
                f"({self.layerwise_peak_bytes / max(1, self.naive_peak_bytes):.2f}x)")


def estimate_init_bytes(fn: Callable[..., Any], *args: Any, dtype: Any) -> InitEstimate:
    """The peak memory of `cast(vmap(fn)(*args))` and of `low_precision_init(fn, *args, dtype=dtype)`,
    both run eagerly, from their jaxprs: nothing is allocated or run. Sizes come from `jax.eval_shape`;
    each jitted piece (random initializers) is compiled, not run, for XLA's count of its temporaries."""
    import jax

    target = _float_dtype(dtype)
    layers, leaves, tree = _layer_args(fn, args)
    batched = [x for x in leaves if _is_array(x) and x.ndim]
    rows = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in batched]

    def single(*row: Any) -> list[Any]:
        return _arrays(fn(*_merge(leaves, tree, row)))

    def naive(*stacked: Any) -> list[Any]:
        return [x.astype(_cast_dtype(x.dtype, target)) for x in jax.vmap(single)(*stacked)]

    one_layer = jax.eval_shape(single, *rows)
    full = layers * sum(_nbytes(x) for x in one_layer)
    cast = layers * sum(_nbytes(x, target) for x in one_layer)
    naive_peak = _eager_peak(jax.make_jaxpr(naive)(*batched))
    layer_peak = _eager_peak(jax.make_jaxpr(single)(*rows))
    return InitEstimate(layers, full, cast, naive_peak, cast + layer_peak)


def _arrays(tree: Any) -> list[Any]:
    import jax

    return [x for x in jax.tree_util.tree_leaves(tree) if _is_array(x)]


def _merge(leaves: Sequence[Any], tree: Any, batched: Sequence[Any]) -> Any:
    """The arguments with the batched array leaves replaced by `batched`, in order."""
    import jax

    rows = iter(batched)
    return jax.tree_util.tree_unflatten(tree, [next(rows) if _is_array(x) and x.ndim else x for x in leaves])


def _nbytes(aval: Any, target: Any = None) -> int:
    import math

    dtype = _cast_dtype(aval.dtype, target) if target is not None else aval.dtype
    return math.prod(aval.shape) * dtype.itemsize


def _eager_peak(closed: Any) -> int:
    """Peak bytes allocated while the jaxpr runs eagerly, one equation at a time: the arrays alive
    (an output lives until its last use; inputs existed before), plus each equation's output and, for
    a jitted equation, XLA's temporaries."""
    from jax.extend.core import Literal

    jaxpr = closed.jaxpr
    last: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, Literal):
                last[v] = i
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            last[v] = len(jaxpr.eqns)
    alive: dict[Any, int] = {}
    peak = 0
    for i, eqn in enumerate(jaxpr.eqns):
        out = {v: _nbytes(v.aval) for v in eqn.outvars if v in last}
        peak = max(peak, sum(alive.values()) + sum(_nbytes(v.aval) for v in eqn.outvars) + _temp_bytes(eqn))
        alive.update(out)
        for v in eqn.invars:
            if not isinstance(v, Literal) and last.get(v) == i:
                alive.pop(v, None)
    return peak


def _temp_bytes(eqn: Any) -> int:
    """XLA's temporaries for a jitted equation (compiled here, not run); 0 for a single primitive."""
    import jax
    from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

    sub = eqn.params.get("jaxpr")
    if eqn.primitive.name not in ("jit", "pjit") or not isinstance(sub, ClosedJaxpr):
        return 0
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in sub.in_avals]
    stats = jax.jit(jaxpr_as_fun(sub)).lower(*shapes).compile().memory_analysis()
    return int(getattr(stats, "temp_size_in_bytes", 0) or 0)


__all__ = ["InitEstimate", "estimate_init_bytes", "low_precision_init"]
