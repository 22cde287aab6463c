"""What an integration hands the engine: probes (metric.py), forensics, cleanups, diagnosis rules and targets.

An integration is plain data built by a factory function in one module per framework
(`process.integration()`, `torch.integration(model)`, ...). The engine only reads it: probes feed the
series, forensics run during an investigation, cleanups form the "clear it, does it still grow?" ladder,
rules turn evidence into findings (a Rule, and the Evidence it reads, are evidence.py's), and targets are
the objects a remedy may act on. These types are the ground floor's: the reading, the judging and the engine
read them, and every integration (leakdoctor/integrations/) builds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from leakdoctor._base.metric import Probe

if TYPE_CHECKING:
    from leakdoctor._base.evidence import Rule

__all__ = ["Forensic", "Cleanup", "Integration"]


class Forensic(Protocol):
    """An expensive look that runs only during an investigation: `begin()`, some steps, `end()`.
    `end` returns a report object that rules read from `Evidence.reports[name]`. A forensic may also
    define `baseline()`, called after the first step of the window: a tracer started at `begin` sees
    the step's own temporaries only from then on, so a baseline taken then cancels them out.

    A forensic with `tracer = True` (the allocation diff) begins after the others: tracemalloc would charge
    each allocation of their begins (heap walks). The forensics end in the reverse of the order they were
    given in."""

    name: str

    def begin(self) -> None: ...

    def end(self, steps: int) -> Any: ...


@dataclass(frozen=True)
class Cleanup:
    """One rung of the cleanup ladder: harmless to the numbers, may free memory (gc, cache clears).
    A `settle` cleanup (malloc_trim) hands freed memory back to the OS: it is a rung of its own first,
    and also runs after every other rung, so each rung's drop in RSS is what that rung freed.
    Framework cache clears are named "clear_cache" (the clear_cache remedy repeats them); one too costly
    for every investigation (jax.clear_caches recompiles everything) sets `in_ladder=False` and serves
    only remedies, under a name of its own ("clear_compile_cache")."""

    name: str
    run: Callable[[], object]
    settle: bool = False
    in_ladder: bool = True


@dataclass
class Integration:
    """Everything one framework contributes to a doctor."""

    name: str
    probes: list[Probe] = field(default_factory=list)
    forensics: list[Forensic] = field(default_factory=list)
    cleanups: list[Cleanup] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    targets: dict[str, Any] = field(default_factory=dict)
    #: At finish(), where a series grew and no finding explains it (leakdoctor/_judging/last_look.py): one bounded
    #: look at what is alive now, given the steps after warm-up; the findings of a cause it proves.
    last_looks: list[Callable[[int], list[Any]]] = field(default_factory=list)
