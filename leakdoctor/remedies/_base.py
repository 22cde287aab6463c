"""The remedy base class: a name, the causes it treats, whether it is safe, apply/on_step/undo, and
what "worked" means. The doctor applies, keeps measuring, and judges; a remedy never raises into the
user's loop because the doctor guards every call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

from leakdoctor._base.findings import Finding
from leakdoctor._base.messages import Record
from leakdoctor._base.integration import Cleanup
from leakdoctor._base.trend import Trend
from leakdoctor._reading.pacing import Pacer


@dataclass
class RemedyContext:
    """What a remedy may look at: the finding it treats, the objects the integrations expose (model,
    optimizer, train state, ...), the current step, this step's keyword context, the typical step
    time (for budgeting periodic work) and the integrations' cleanups (for remedies that repeat one)."""

    finding: Finding
    targets: Mapping[str, Any]
    step: int = 0
    context: Mapping[str, Any] = field(default_factory=dict)
    step_seconds: float = 0.0
    cleanups: Sequence[Cleanup] = ()


class Remedy:
    """Subclass per remedy, one file each, and expose the class as `REMEDY` in that module."""

    name: ClassVar[str]
    treats: ClassVar[frozenset[str]]
    safe: ClassVar[bool]
    #: The slope after must fall to at most this fraction of the slope before.
    max_rate_ratio: ClassVar[float] = 0.25
    #: Does it stop a count's growth? A remedy that frees what the items hold while the user's code goes
    #: on adding them (detach_retained on a list's length) has no rate after on the count.
    stops_count: ClassVar[bool] = True

    def applicable(self, ctx: RemedyContext) -> bool:
        """Can this remedy act on this finding here (framework present, target known)?"""
        return ctx.finding.cause in self.treats

    def apply(self, ctx: RemedyContext) -> Record | str:
        """Act once; return what was done: a record of the message catalogue (base/messages.py)."""
        raise NotImplementedError

    def on_step(self, ctx: RemedyContext) -> None:
        """Act again after every step, for remedies that must keep acting (force_eval, remove_hooks)."""

    def undo(self, ctx: RemedyContext) -> bool:
        """Revert `apply` when the remedy did not work; False when it cannot be undone."""
        return False

    def worked(self, rate_before: float, after: Trend) -> bool:
        """Effective when the growth is no longer significant and its slope fell enough."""
        return not after.growing and after.slope <= self.max_rate_ratio * rate_before

    def held(self, rate_before: float, after: Trend) -> bool:
        """Still effective when its leak is found again later? Only the leak back at a good share of its
        rate says no: a remedy that acts every few steps leaves a pile between its runs that an
        investigation finds again, and the heap around it may creep by a few hundred bytes a step."""
        return self.worked(rate_before, after) or not (after.growing and
                                                       after.slope > self.max_rate_ratio * rate_before)


class Periodic:
    """Runs `action` every n steps, n paced so that the action costs at most `budget` of step time."""

    def __init__(self, action: Callable[[], object], budget: float = 0.01, minimum: int = 1,
                 maximum: int = 1000) -> None:
        self.action = action
        self._pacer = Pacer(budget, minimum, maximum)
        self._countdown = 0

    @property
    def every(self) -> int:
        return self._pacer.every

    @property
    def every_at_most(self) -> int:
        return self._pacer.maximum

    def tick(self, step_seconds: float) -> bool:
        """Count one step; run the action when due. Returns whether it ran."""
        self._countdown -= 1
        if self._countdown > 0:
            return False
        start = time.perf_counter()
        self.action()
        self._countdown = self._pacer.update(time.perf_counter() - start, step_seconds)
        return True
