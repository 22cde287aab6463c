"""gc_collect: collect reference cycles periodically when they pile up faster than the garbage collector
runs (gc disabled, frozen, or thresholds raised). Safe: collecting garbage changes no results.
Applies only when the investigation saw gc.collect() take the growth back."""

from __future__ import annotations

import gc

from leakdoctor.remedies.base import Periodic, Remedy, RemedyContext


class GcCollect(Remedy):
    name = "gc_collect"
    treats = frozenset({"python_objects"})
    safe = True

    def __init__(self) -> None:
        self._periodic = Periodic(lambda: gc.collect(1), budget=0.01)

    def applicable(self, ctx: RemedyContext) -> bool:
        return super().applicable(ctx) and ctx.finding.reclaimed_by == "gc_collect"

    def apply(self, ctx: RemedyContext) -> str:
        gc.collect()
        return "gc.collect() now, then young-generation collections within 1% of step time"

    def on_step(self, ctx: RemedyContext) -> None:
        self._periodic.tick(ctx.step_seconds)


REMEDY = GcCollect
