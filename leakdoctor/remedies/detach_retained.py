"""detach_retained: replace the tensors that a holder keeps across steps (a list on the model, a local
list, a global) with detached ones, so their autograd graphs, and the activations those graphs saved,
are freed. The loop keeps adding, so new items are detached after every step. Not safe: a program that
meant to call backward() through the kept tensors later can no longer do it. Applies to a retained_graph
finding on memory (bytes) whose holders were found (its subject)."""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any

from leakdoctor.integrations.torch_graphs import Holder
from leakdoctor.remedies.base import Remedy, RemedyContext


def detached(value: Any, depth: int = 2) -> Any:
    """`value` with the tensors holding an autograd graph replaced by detached ones: lists and dicts are
    changed in place, tuples rebuilt; `depth` containers deep."""
    if getattr(value, "grad_fn", None) is not None and callable(getattr(value, "detach", None)):
        return value.detach()
    if depth == 0:
        return value
    if isinstance(value, (list, deque)):
        for i, item in enumerate(value):
            value[i] = detached(item, depth - 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            value[key] = detached(item, depth - 1)
    elif isinstance(value, tuple):
        items = [detached(item, depth - 1) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


class DetachRetained(Remedy):
    name = "detach_retained"
    treats = frozenset({"retained_graph"})
    safe = False

    def __init__(self) -> None:
        self._holders: list[Holder] = []
        self._done: dict[int, int] = {}  # holder index -> items of its list/dict already detached

    def applicable(self, ctx: RemedyContext) -> bool:
        return super().applicable(ctx) and ctx.finding.unit == "bytes" and bool(ctx.finding.subject)

    def apply(self, ctx: RemedyContext) -> str:
        self._holders = list(ctx.finding.subject)
        self._detach_all()
        return f"detached the tensors held by {', '.join(h.name for h in self._holders)}, and new ones after every step"

    def on_step(self, ctx: RemedyContext) -> None:
        self._detach_all()

    def _detach_all(self) -> None:
        for index, holder in enumerate(self._holders):
            self._detach(index, holder)

    def _detach(self, index: int, holder: Holder) -> None:
        value = holder.get()
        if value is None:
            return
        if getattr(value, "grad_fn", None) is not None:
            if holder.rebind is not None:
                holder.rebind(value.detach())
            else:
                value.detach_()  # a local variable: its tensor is changed in place
        elif isinstance(value, (list, dict)):
            self._detach_new(index, value)
        else:
            detached(value)

    def _detach_new(self, index: int, container: list | dict) -> None:
        """Detach the items added since the last call (all of them if the container shrank)."""
        start = self._done.get(index, 0)
        start = start if start <= len(container) else 0
        if isinstance(container, list):
            for i in range(start, len(container)):
                container[i] = detached(container[i], 1)
        else:
            for key in list(islice(container, start, None)):
                container[key] = detached(container[key], 1)
        self._done[index] = len(container)


REMEDY = DetachRetained
