"""cond_to_where: rewrite a JAX function so that every `lax.cond` computes all its branches and picks
the result with `lax.select_n`; for an optax transformation, the same with its `update`.

Why: outside `jax.jit`, a `lax.cond` whose branches are closures made anew on every call (the old optax
RAdam, optax#969, jax#12719) is traced and compiled again on every call, and every compiled copy stays
cached: memory grows by about a megabyte per step. The rewritten function is traced once per input
signature, like `jax.jit`, and then runs its primitives one by one, each compiled once, so it stops
compiling. The plain alternative, when it fits the program, is `jax.jit` on the update or on the whole
training step: the cond then compiles once.

    fast_update = cond_to_where(update)          # any JAX function of arrays and pytrees
    tx = cond_to_where(optax.radam(1e-3))        # an optax transformation: same init, rewritten update

The same arithmetic as the original, with both branches computed (cheap for optimizer arithmetic); the
primitives run one by one instead of fused into one compiled update, so results agree to rounding (a
loss may differ in its 7th digit), not bit for bit. Like jit,
the function must be pure: what it reads besides its arguments is frozen at its first call per
signature. Differentiating through the rewritten function can give NaN where an unselected branch is
singular (the jnp.where caveat). Conds with side effects are kept as they are.

As a remedy (remedies="all"), it treats compile_cache findings that the jaxpr scan traced to an
optimizer's re-traced cond; the Flax loop doctor hands back the state with the rewritten transformation
(`transform_optimizer`). Not "safe": the program computes both branches from then on.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from leakdoctor._base.messages import Record, msg
from leakdoctor._base.guard import warn
from leakdoctor.remedies._base import Remedy, RemedyContext

__all__ = ["cond_to_where", "rewrite_jaxpr", "count_conds", "CondToWhere", "REMEDY"]


def cond_to_where(target: Any) -> Any:
    """`target` (a JAX function, or an optax GradientTransformation) with every cond, nested ones
    included, replaced by its branches and a select_n."""
    if _is_transformation(target):
        return target._replace(update=cond_to_where(target.update))
    if not callable(target):
        raise TypeError(f"cond_to_where: expected a function or an optax GradientTransformation, got {target!r}")
    return _rewritten_function(target)


def _is_transformation(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_replace") and callable(getattr(obj, "init", None)) \
        and callable(getattr(obj, "update", None))


def _rewritten_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    import jax
    from jax.extend.core import jaxpr_as_fun

    traced: dict[Any, tuple[Any, Any]] = {}

    @functools.wraps(fn)
    def rewritten(*args: Any, **kwargs: Any) -> Any:
        leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
        key = (in_tree, tuple(jax.typeof(x) for x in leaves))
        entry = traced.get(key)
        if entry is None:
            entry = _trace(fn, in_tree, leaves)
            if not any(isinstance(c, jax.core.Tracer) for c in entry[0].consts):
                traced[key] = entry
        closed, out_tree = entry
        return jax.tree_util.tree_unflatten(out_tree, jaxpr_as_fun(closed)(*leaves))

    return rewritten


def _trace(fn: Callable[..., Any], in_tree: Any, leaves: Sequence[Any]) -> tuple[Any, Any]:
    """fn's jaxpr for these argument types, rewritten, and the tree of its output."""
    import jax

    out_tree: list[Any] = []

    def flat(*xs: Any) -> list[Any]:
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, xs)
        out, tree = jax.tree_util.tree_flatten(fn(*args, **kwargs))
        out_tree.append(tree)
        return out

    closed = jax.make_jaxpr(flat)(*leaves)
    return rewrite_jaxpr(closed), out_tree[0]


def rewrite_jaxpr(closed: Any) -> Any:
    """A ClosedJaxpr equal to `closed` with every cond (also inside jit, scan, while...) replaced by the
    evaluation of all branches and a select_n. Returned unchanged when it holds no cond."""
    import jax

    if not _has_cond(closed.jaxpr):
        return closed
    placeholders = _placeholders(closed.in_avals)
    if placeholders is None:
        return closed
    return jax.make_jaxpr(functools.partial(_evaluate, closed.jaxpr, closed.consts))(*placeholders)


def count_conds(closed: Any) -> int:
    """How many cond equations `closed` holds, nested ones included."""
    return _count(closed.jaxpr)


def _count(jaxpr: Any) -> int:
    from jax.extend.core import jaxprs_in_params

    return sum((e.primitive.name == "cond") + sum(_count(j) for j in jaxprs_in_params(e.params))
               for e in jaxpr.eqns)


def _has_cond(jaxpr: Any) -> bool:
    return _count(jaxpr) > 0


def _plain(avals: Sequence[Any]) -> bool:
    """Are these all plain arrays (not tokens or refs), which select_n can pick from?"""
    from jax.core import ShapedArray

    return all(type(a) is ShapedArray for a in avals)


def _placeholders(avals: Sequence[Any]) -> list[Any] | None:
    """ShapeDtypeStructs for plain array avals; None if any aval is something else (token, ref)."""
    import jax

    if not _plain(avals):
        return None
    return [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]


def _evaluate(jaxpr: Any, consts: Sequence[Any], *args: Any) -> list[Any]:
    """Evaluate `jaxpr` (under a trace), with conds evaluated as select_n over all branches."""
    from jax.extend.core import Literal

    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        if eqn.primitive.name == "cond" and not eqn.effects and _plain([v.aval for v in eqn.outvars]):
            outs = _select(eqn.params["branches"], values)
        else:
            outs = _bind(eqn, values)
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _select(branches: Sequence[Any], values: Sequence[Any]) -> list[Any]:
    from jax import lax

    index, *operands = values
    results = [_evaluate(b.jaxpr, b.consts, *operands) for b in branches]
    return [lax.select_n(index, *cases) for cases in zip(*results)]


def _bind(eqn: Any, values: Sequence[Any]) -> list[Any]:
    params = {k: _rewrite_param(v) for k, v in eqn.params.items()}
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(params))
    return list(out) if eqn.primitive.multiple_results else [out]


def _rewrite_param(value: Any) -> Any:
    """Sub-jaxprs (of jit, scan, while, custom_jvp...) rewritten; other parameters as they are."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    if isinstance(value, ClosedJaxpr):
        return rewrite_jaxpr(value)
    if isinstance(value, Jaxpr):
        return _rewrite_open(value)
    if isinstance(value, tuple) and value and all(isinstance(v, (ClosedJaxpr, Jaxpr)) for v in value):
        return tuple(_rewrite_param(v) for v in value)
    return value


def _rewrite_open(jaxpr: Any) -> Any:
    from jax.extend.core import ClosedJaxpr

    if jaxpr.constvars or not _has_cond(jaxpr):
        return jaxpr
    closed = rewrite_jaxpr(ClosedJaxpr(jaxpr, []))
    return closed.jaxpr if not closed.consts else jaxpr


# --- the remedy -------------------------------------------------------------------------------------

def _with_fallback(original: Any, rewritten: Any) -> Any:
    """The rewritten transformation, whose update falls back to the original one, with a warning, if it
    cannot be traced (a remedy must never break the user's step; verification then undoes it)."""
    update, fallback = rewritten.update, original.update
    failed: list[BaseException] = []

    @functools.wraps(fallback)
    def safe_update(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            try:
                return update(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - keep training with the original update
                failed.append(err)
                warn(f"leakdoctor: cond_to_where could not trace the optimizer update "
                     f"({type(err).__name__}: {err}); the original update goes on", stacklevel=3)
        return fallback(*args, **kwargs)

    return rewritten._replace(update=safe_update)


class CondToWhere(Remedy):
    name = "cond_to_where"
    treats = frozenset({"compile_cache"})
    safe = False

    def __init__(self) -> None:
        self._original: Any = None
        self._rewritten: Any = None
        self._sites = 0

    def applicable(self, ctx: RemedyContext) -> bool:
        report = ctx.finding.subject
        return super().applicable(ctx) and _is_transformation(getattr(report, "transformation", None)) \
            and bool(getattr(report, "retraced", None))

    def apply(self, ctx: RemedyContext) -> Record:
        report = ctx.finding.subject
        self._original = report.transformation
        self._rewritten = _with_fallback(self._original, cond_to_where(self._original))
        self._sites = len(report.sites)
        return msg("remedy_cond_to_where", sites=self._sites, retraced="; ".join(s.describe() for s in report.retraced))

    def transform_optimizer(self, tx: Any) -> Any:
        """The rewritten transformation for the one this remedy treats; any other `tx` unchanged."""
        return self._rewritten if self._original is not None and tx == self._original else tx

    def undo(self, ctx: RemedyContext) -> bool:
        """The loop doctor hands back the original transformation from the next step on."""
        self._original = self._rewritten = None
        return True


REMEDY = CondToWhere
