"""gc_collect: collect reference cycles periodically when they pile up faster than the garbage collector
runs (gc disabled, frozen, or thresholds raised). Safe: collecting garbage changes no results.
Applies only when the investigation saw gc.collect() take the growth back."""

from __future__ import annotations

import gc

from leakdoctor._base.messages import Record, msg
from leakdoctor._base.findings import Finding
from leakdoctor.remedies._base import Periodic, Remedy, RemedyContext

#: The most garbage left between two collections. Freeing a pile costs the same whether it is collected
#: often or seldom, so pacing by the collection's cost alone would let the pile grow without end.
PILE_BYTES = 16 * 2**20


class GcCollect(Remedy):
    name = "gc_collect"
    treats = frozenset({"python_objects"})
    safe = True

    def __init__(self) -> None:
        self._periodic: Periodic | None = None

    def applicable(self, ctx: RemedyContext) -> bool:
        return super().applicable(ctx) and ctx.finding.reclaimed_by == "gc_collect"

    def apply(self, ctx: RemedyContext) -> Record:
        gc.collect()
        self._periodic = Periodic(lambda: gc.collect(1), budget=0.01, maximum=steps_per_pile(ctx.finding))
        return msg("remedy_gc_collect", every=self._periodic.every_at_most)

    def on_step(self, ctx: RemedyContext) -> None:
        if self._periodic is not None:
            self._periodic.tick(ctx.step_seconds)


def steps_per_pile(finding: Finding) -> int:
    """The most steps between collections: those that leave PILE_BYTES at the finding's rate."""
    if finding.unit != "bytes" or finding.rate_per_step <= 0:
        return 1000
    return max(1, min(1000, int(PILE_BYTES / finding.rate_per_step)))


REMEDY = GcCollect
