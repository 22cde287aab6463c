"""force_eval: after every step, mx.eval(model.parameters(), optimizer.state) plus the arrays handed to
`doctor.step(...)`, so MLX's lazy graph cannot chain across steps. It is the evaluation MLX's own
training loops do after optimizer.update, and the fix given for the MLX 0.16 report (mlx#1271). Safe:
evaluating now computes exactly what would have been computed later, with the same operations, so no
number changes; the cost is the evaluation the loop should have been doing anyway.

It calls MLX's own `mx.eval`, never a wrapper put in its place (`leakdoctor run --step-on mlx.core:eval`
makes each return of mx.eval a step: evaluating through it would step the doctor from inside its step)."""

from __future__ import annotations

import inspect
from typing import Any

from leakdoctor._base.messages import Record, msg
from leakdoctor.integrations._mlx import STATE, core, state_trees
from leakdoctor.remedies._base import Remedy, RemedyContext


class ForceEval(Remedy):
    name = "force_eval"
    treats = frozenset({"lazy_graph"})
    safe = True

    def applicable(self, ctx: RemedyContext) -> bool:
        """A chain through the state needs the model or optimizer; a chain through a variable of the loop
        needs that variable handed to doctor.step(...)."""
        chain = ctx.finding.subject
        state = getattr(chain, "state", True)
        return super().applicable(ctx) and bool(_state(ctx) if state else _registered(ctx))

    def apply(self, ctx: RemedyContext) -> Record:
        self.on_step(ctx)
        parts = [STATE] if _state(ctx) else []
        parts += [f"doctor.step({name}=...)" for name in sorted(_registered_names(ctx))]
        return msg("remedy_force_eval", parts=parts)

    def on_step(self, ctx: RemedyContext) -> None:
        _eval()(*_state(ctx), *_registered(ctx))


def _eval() -> Any:
    """mx.eval itself: wrappers (functools.wraps keeps `__wrapped__`) are followed to the original."""
    return inspect.unwrap(core().eval)


def _holders(ctx: RemedyContext) -> tuple:
    found = [ctx.targets.get("model"), ctx.targets.get("optimizer"), *getattr(ctx.finding.subject, "holders", ())]
    unique = {id(o): o for o in found if o is not None}
    return tuple(unique.values())


def _state(ctx: RemedyContext) -> list[Any]:
    return state_trees(_holders(ctx))


def _registered(ctx: RemedyContext) -> list[Any]:
    return [ctx.context[name] for name in _registered_names(ctx)]


def _registered_names(ctx: RemedyContext) -> list[str]:
    """Keyword arguments of doctor.step(...) that hold arrays (or trees of them)."""
    from mlx.utils import tree_flatten

    array = core().array
    return [name for name, value in ctx.context.items()
            if any(isinstance(leaf, array) for _, leaf in tree_flatten(value))]


REMEDY = ForceEval
