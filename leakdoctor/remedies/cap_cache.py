"""cap_cache: bound MLX's buffer cache with mx.set_cache_limit instead of clearing it every step.

The cap is the largest transient working set seen so far, peak minus active memory: what one step
allocates and frees, so a fixed-shape step still finds every buffer it needs in the cache (clearing it
every step would make it reallocate them all, which the MLX maintainers warn slows training), while
buffers of sizes that vary from step to step can no longer pile up. The limit is never raised, and
`undo` restores the previous one, after which the registry tries clear_cache. Safe: the cache holds
no live data."""

from __future__ import annotations

from leakdoctor._base.messages import Record, msg
from leakdoctor.integrations._mlx import CACHE, core
from leakdoctor.remedies._base import Remedy, RemedyContext


class CapCache(Remedy):
    name = "cap_cache"
    treats = frozenset({"allocator_cache"})
    safe = True

    def __init__(self) -> None:
        self._previous: int | None = None

    def applicable(self, ctx: RemedyContext) -> bool:
        """Only for growth that MLX's buffer cache accounts for (a finding that explains its metric)."""
        return super().applicable(ctx) and CACHE in ctx.finding.explains

    def apply(self, ctx: RemedyContext) -> Record:
        mx = core()
        peak, active = mx.get_peak_memory(), mx.get_active_memory()
        cap = max(0, peak - active)
        self._previous = mx.set_cache_limit(cap)
        if cap > self._previous:
            cap = self._previous
            mx.set_cache_limit(cap)
        return msg("remedy_cap_cache", cap=cap, peak=peak, active=active, previous=self._previous)

    def undo(self, ctx: RemedyContext) -> bool:
        if self._previous is None:
            return False
        core().set_cache_limit(self._previous)
        self._previous = None
        return True


REMEDY = CapCache
