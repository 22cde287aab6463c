"""clear_cache: repeat, within 1% of step time, the framework cache clear that took the growth back
during the investigation (torch.cuda/mps.empty_cache, mx.clear_cache), or, for a compile cache, the
integration's compile-cache clear (jax.clear_caches). Safe: freed cache memory holds no live data and
cleared compilations are rebuilt with the same results."""

from __future__ import annotations

from leakdoctor._base.messages import Record, msg
from leakdoctor._base.integration import Cleanup
from leakdoctor.remedies._base import Periodic, Remedy, RemedyContext

_NOT_CACHES = ("gc_collect", "malloc_trim")


class ClearCache(Remedy):
    name = "clear_cache"
    treats = frozenset({"allocator_cache", "compile_cache"})
    safe = True

    def __init__(self) -> None:
        self._clears: list[Cleanup] = []
        self._periodic = Periodic(self._run, budget=0.01)

    def applicable(self, ctx: RemedyContext) -> bool:
        # Clearing a cache frees memory; it cannot flatten a count (compiles per step), so a finding
        # on a count metric is left to a remedy that removes the cause.
        return super().applicable(ctx) and ctx.finding.unit == "bytes" and bool(self._matching(ctx))

    def apply(self, ctx: RemedyContext) -> Record:
        self._clears = self._matching(ctx)
        self._run()
        return msg("remedy_clear_cache", clears=[c.name for c in self._clears])

    def on_step(self, ctx: RemedyContext) -> None:
        self._periodic.tick(ctx.step_seconds)

    def _run(self) -> None:
        for clear in self._clears:
            clear.run()

    @staticmethod
    def _matching(ctx: RemedyContext) -> list[Cleanup]:
        finding = ctx.finding
        wanted = "clear_compile_cache" if finding.cause == "compile_cache" else finding.reclaimed_by
        return [c for c in ctx.cleanups if c.name == wanted and c.name not in _NOT_CACHES]


REMEDY = ClearCache
