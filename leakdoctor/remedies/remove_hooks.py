"""remove_hooks: drop the hooks registered again and again on a module (the same function every step),
keeping the first registration. The loop that adds them keeps running, so the repeats are dropped again
after every step. Not safe: a hook the program meant to run several times now runs once. Applies when
the hook_accumulation finding found repeated registrations (its subject: the hook tables that hold them)."""

from __future__ import annotations

from typing import Any

from leakdoctor._base.messages import Record, msg
from leakdoctor.integrations._torch import HOOK_EXTRAS, duplicate_handles
from leakdoctor.remedies._base import Remedy, RemedyContext


def drop_repeats(module: Any, kind: str) -> int:
    """Remove the repeated hooks from one hook table of `module` (and their per-handle flags)."""
    table = vars(module).get(kind) or {}
    repeats = duplicate_handles(table)
    flags = [vars(module).get(name) or {} for name in HOOK_EXTRAS.get(kind, ())]
    for handle in repeats:
        del table[handle]
        for extra in flags:
            extra.pop(handle, None)
    return len(repeats)


class RemoveHooks(Remedy):
    name = "remove_hooks"
    treats = frozenset({"hook_accumulation"})
    safe = False

    def __init__(self) -> None:
        self._tables: list[tuple[Any, str]] = []  # (weakref to a module, hook table attribute)

    def applicable(self, ctx: RemedyContext) -> bool:
        return super().applicable(ctx) and bool(ctx.finding.subject)

    def apply(self, ctx: RemedyContext) -> Record:
        self._tables = list(ctx.finding.subject)
        removed = self._drop()
        return msg("remedy_remove_hooks", removed=removed, tables=len(self._tables))

    def on_step(self, ctx: RemedyContext) -> None:
        self._drop()

    def _drop(self) -> int:
        return sum(drop_repeats(module, kind) for ref, kind in self._tables if (module := ref()) is not None)


REMEDY = RemoveHooks
