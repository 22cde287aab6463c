"""malloc_trim: return free heap pages to the OS periodically (glibc only) when resident memory grows
only because the C allocator keeps freed memory. Safe: it moves no live data. Applies only when the
investigation saw malloc_trim take the growth back; skipped where libc has no malloc_trim."""

from __future__ import annotations

from leakdoctor._base.messages import Record, msg
from leakdoctor.integrations._process import malloc_trim
from leakdoctor.remedies._base import Periodic, Remedy, RemedyContext


class MallocTrim(Remedy):
    name = "malloc_trim"
    treats = frozenset({"allocator_cache", "native_memory"})
    safe = True

    def __init__(self) -> None:
        self._trim = malloc_trim()
        self._periodic = Periodic(self._trim or (lambda: None), budget=0.01)

    def applicable(self, ctx: RemedyContext) -> bool:
        return (super().applicable(ctx) and self._trim is not None
                and ctx.finding.reclaimed_by == "malloc_trim" and ctx.finding.metric == "rss_bytes")

    def apply(self, ctx: RemedyContext) -> Record:
        return msg("remedy_malloc_trim")

    def on_step(self, ctx: RemedyContext) -> None:
        self._periodic.tick(ctx.step_seconds)


REMEDY = MallocTrim
