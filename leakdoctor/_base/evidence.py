"""What an investigation hands the rules, and what a rule is: the types that the judging
(_judging/investigate.py, _judging/diagnosis.py) and the integrations' rules (integrations/*.py) share, so
neither imports the other.

Ladder: the readings of every metric around each rung of the cleanup ladder. Evidence: everything one
investigation saw, with the arithmetic the rules share (did a suspect survive the ladder, which rung took
it back). Rule: one diagnosis rule, a function of the evidence and the findings accepted so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from leakdoctor._base.findings import Finding
from leakdoctor._base.messages import Location, Record, msg
from leakdoctor._base.metric import MetricSpec
from leakdoctor._base.trend import Trend, is_material

__all__ = ["HEAP", "MAPPED", "RSS", "ACCOUNTED", "Ladder", "Evidence", "Rule"]

#: What the cleanup ladder reads besides the series (process.RssProbe.read_now): what backs resident
#: memory, malloc's bytes in use and the mapped address space.
HEAP, MAPPED = "heap_bytes", "mapped_bytes"
RSS = "rss_bytes"

#: Fraction of the growth the suspicion's slope predicts for the window that must be accounted for:
#: still there after the cleanup ladder (a real leak), or taken back by one rung (named by it).
ACCOUNTED = 0.5


@dataclass
class Ladder:
    """Readings of every metric before and after each cleanup rung: [("before", {...}), (rung, {...})],
    taken at `step`. `settle` names the rungs (malloc_trim) that only hand already-freed memory back."""

    rungs: list[tuple[str, dict[str, float]]]
    settle: frozenset[str] = frozenset()
    step: int = 0

    def before(self, metric: str) -> float | None:
        return self.rungs[0][1].get(metric)

    def after(self, metric: str) -> float | None:
        return self.rungs[-1][1].get(metric)

    def drops(self, metric: str) -> list[tuple[str, float]]:
        """How much each rung took back."""
        values = [(name, readings.get(metric)) for name, readings in self.rungs]
        return [(name, prev - cur) for (_, prev), (name, cur) in zip(values, values[1:])
                if prev is not None and cur is not None]


@dataclass
class Evidence:
    """Everything one investigation saw, with the arithmetic rules share.

    Single readings of resident memory are noisy (the C allocator keeps freed temporaries), so growth
    is judged on cleaned levels: `residual` compares the level after the whole ladder at the end of the
    window with the same at its start. A suspect that kept at least ACCOUNTED of its expected growth,
    in each half of the window (a leak grows throughout; a working set of varying size does not),
    `survives` (a leak); one whose growth a rung took back is `reclaimed_by` that rung (a specific rung
    such as gc_collect or clear_cache first, the settle rung only when none explains it); anything
    else is dismissed: the growth stopped, or was noise. `remedies` are the remedies the user allows
    (what can be done here); rules `note` what needs saying about a metric but is no finding."""

    start_step: int
    end_step: int
    suspects: dict[str, Trend]
    trends: dict[str, Trend]
    specs: dict[str, MetricSpec]
    begin: Ladder
    end: Ladder
    reports: dict[str, Any]
    remedies: tuple[str, ...] = ()
    notes: dict[str, Record] = field(default_factory=dict)
    middle: Ladder | None = None
    horizon: int = 100_000  # steps over which a growth must matter (Settings.horizon)

    @property
    def steps(self) -> int:
        return max(1, self.end_step - self.start_step)

    def expected(self, metric: str) -> float:
        """Growth over the window that the suspicion's slope predicts."""
        trend = self.suspects.get(metric)
        return trend.slope * self.steps if trend else 0.0

    def residual(self, metric: str) -> float:
        """Growth that is still there after the cleanup ladder, start to end of the window."""
        start, stop = self.begin.after(metric), self.end.after(metric)
        return 0.0 if start is None or stop is None else stop - start

    def survives(self, metric: str) -> bool:
        """A suspect whose growth survived the cleanup ladder, in both halves of the window: a leak."""
        need = ACCOUNTED * self.expected(metric)
        return need > 0 and self._grew_by(metric, need)

    def _halves(self, metric: str) -> tuple[float, float] | None:
        """Growth in each half of the window, read after the ladders; None where one did not read it."""
        start, stop = self.begin.after(metric), self.end.after(metric)
        middle = self.middle.after(metric) if self.middle else None
        if start is None or stop is None or middle is None:
            return None
        return middle - start, stop - middle

    def _grew_by(self, metric: str, need: float) -> bool:
        """Did `metric`, read after each ladder, grow by `need` over the window, and by half of it in each
        half (where a middle ladder read it)?"""
        if self.residual(metric) < need:
            return False
        halves = self._halves(metric)
        return halves is None or min(halves) >= need / 2

    def kept(self, metric: str) -> float:
        """What the ladders saw a metric keep through the window, more than a refill of trimmed pages: for
        a suspect, what survived; for another (its trend not significant yet: resident memory when a gauge
        that holds it is investigated), the growth that both halves of the window support (twice the
        smaller half: a one-off jump in one half is none)."""
        if metric in self.suspects:
            return self.residual(metric) if self.survives(metric) and not self.refilled(metric) else 0.0
        halves = self._halves(metric)
        both = 2 * min(halves) if halves is not None else 0.0
        return both if both > 0 and not self.refilled(metric, ACCOUNTED * both) else 0.0

    def refilled(self, metric: str, need: float | None = None) -> bool:
        """Did resident memory that survived the ladders only fault in pages that malloc already held?
        Nothing new was allocated for it: neither malloc's bytes in use nor the mapped address space kept
        the growth through the window. Two ways, both seen on real runs: after a trim, a step's small
        allocations that last land in returned pages and fault them in again (a Lightning run: ~90 KiB a
        step, for a few hundred steps; the cleaned level is still below where the window began), which the
        run without the ladder never does; and a worker thread's freed temporary stays resident at the top
        of that thread's malloc heap, which malloc_trim cannot return (it trims the top of the main heap
        only): XLA's evaluation of a test set at an epoch's end, 24 MiB. The second is read on resident
        memory alone. Unknown (False) where malloc cannot be asked. `need`: the growth to account for (by
        default, half what the suspicion predicts)."""
        stop, before = self.end.after(metric), self.begin.before(metric)
        if stop is None or before is None or self.begin.after(HEAP) is None:
            return False
        if stop > before and metric != RSS:
            return False
        need = ACCOUNTED * self.expected(metric) if need is None else need
        return not any(self._grew_by(backing, need) for backing in (HEAP, MAPPED))

    def malloc_kept(self, metric: str) -> bool | None:
        """Did malloc's bytes in use keep the growth a suspect predicts through the window (in both
        halves)? None where malloc cannot be asked."""
        if self.begin.after(HEAP) is None or self.end.after(HEAP) is None:
            return None
        return self._grew_by(HEAP, ACCOUNTED * self.expected(metric))

    @property
    def last_span(self) -> int:
        """Steps since the ladder before the last one (the span a rung's drop at the end covers)."""
        return self.end_step - (self.middle.step if self.middle else self.start_step)

    def reclaimed_by(self, metric: str) -> str | None:
        """The rung that took back the growth since the previous ladder (a specific rung first)."""
        need = ACCOUNTED * self.expected(metric) * self.last_span / self.steps
        if need <= 0 or self.survives(metric):
            return None
        drops = self.end.drops(metric)
        ordered = [d for d in drops if d[0] not in self.end.settle] + [d for d in drops if d[0] in self.end.settle]
        return next((name for name, drop in ordered if drop >= need), None)

    def growing(self, metric: str) -> bool:
        """Did a suspect really grow during the window (it survived, or a rung took it back)?"""
        return self.survives(metric) or self.reclaimed_by(metric) is not None

    def growth(self, metric: str) -> float:
        """How much the metric grew during the window: what survived, or what its rung took back; for a
        metric that is no suspect, what the ladders saw it grow."""
        if metric not in self.suspects:
            return self.residual(metric)
        if self.survives(metric):
            return self.residual(metric)
        rung = self.reclaimed_by(metric)
        return dict(self.end.drops(metric)).get(rung, 0.0) if rung else 0.0

    def matters_at_low_end(self, metric: str) -> bool:
        """Does the low end of the suspicion's rate matter over the horizon? A finding that nothing proves
        (the fallback's: it grew and nothing accounts for it) stands on the rate the readings support, not
        on the estimate: early in a clean run, the tail of the warm-up lifts a short window's slope over the
        line while its interval reaches far below it."""
        trend, spec = self.suspects.get(metric), self.specs.get(metric)
        if trend is None or spec is None:
            return True
        level = self.begin.after(metric) or 0.0
        return is_material(spec.unit, min(trend.slope, trend.slope_low), level, self.horizon, spec.limit)

    @property
    def confirmed(self) -> list[str]:
        return [m for m in self.suspects if self.growing(m)]

    def explained(self, metric: str, accepted: Sequence[Finding]) -> bool:
        """Does a finding accepted so far explain the metric, or has a rule noted it (a note is a rule's
        verdict too: not a leak, said why)?"""
        return metric in self.notes or any(metric in f.explains for f in accepted)

    def unexplained(self, accepted: Sequence[Finding]) -> list[str]:
        """Confirmed suspects that are not explained yet."""
        return [m for m in self.confirmed if not self.explained(m, accepted)]

    def measured(self, metric: str, accepted: Sequence[Finding]) -> float:
        """Bytes of the metric's growth in the window that the accepted findings' own evidence measured."""
        return sum(f.accounts.get(metric, 0.0) for f in accepted if metric in f.explains)

    def unmeasured(self, metric: str, accepted: Sequence[Finding]) -> float:
        """The part of the growth that the accepted findings did not measure: of the window's growth or what
        the suspicion predicts for it, whichever is less (a window that also holds a warm-up's growth grows
        far more than the leaks in it)."""
        return min(self.growth(metric), self.expected(metric)) - self.measured(metric, accepted)

    def unaccounted(self, accepted: Sequence[Finding]) -> list[str]:
        """Confirmed suspects in which a rule that measures its own bytes may still prove a cause: those
        nothing explains yet, and those that accepted findings explain without having measured most of the
        growth (a kept graph's saved activations have no size a census reads). Each proven cause is its own
        finding: one leak explaining a metric does not hide a second one growing in the same metric."""
        return [m for m in self.confirmed if m not in self.notes and (
            not self.explained(m, accepted) or self.unmeasured(m, accepted) >= ACCOUNTED * self.expected(m))]

    def rate(self, metric: str) -> float:
        trend = self.suspects.get(metric) or self.trends.get(metric)
        return trend.slope if trend else self.growth(metric) / self.steps

    def describe(self, metric: str) -> Record:
        """'rss_bytes grew 1.2 MiB in 10 steps (120.0 KiB/step)' (the `grew` record): the growth the window
        saw and its own pace, which the trend's rate (the finding's) may differ from, said so where it does
        by twice."""
        unit = self.specs[metric].unit if metric in self.specs else "count"
        steps = self.steps if metric not in self.suspects or self.survives(metric) else self.last_span
        growth, trend = self.growth(metric), self.rate(metric)
        pace = growth / steps
        faster = msg("trend_rate", rate=trend, unit=unit) if trend and pace and not 0.5 <= trend / pace <= 2 else None
        return msg("grew", metric=metric, growth=growth, steps=steps, pace=pace, unit=unit, trend=faster)

    def note(self, metric: str, note: Record) -> None:
        """Say something about a metric in the summary's notes, without a finding."""
        self.notes[metric] = msg("at_step", step=self.end_step, note=note)

    def finding(self, cause: str, metric: str, *, evidence: Record, recommendation: Record,
                location: Location | str | None = None, **extra: Any) -> Finding:
        """A Finding for `metric` with onset, rate and unit filled in from this evidence."""
        trend = self.suspects.get(metric)
        return Finding(
            cause=cause,
            metric=metric,
            first_step=int(trend.onset_step) if trend and trend.onset_step is not None else self.start_step,
            detected_step=self.end_step,
            rate_per_step=self.rate(metric),
            rate_interval=(trend.slope_low, trend.slope_high) if trend else None,
            unit=self.specs[metric].unit if metric in self.specs else "count",
            location=location,
            evidence=evidence,
            recommendation=recommendation,
            **extra,
        )


@dataclass(frozen=True)
class Rule:
    """A diagnosis rule: reads the evidence and the findings accepted so far, returns new findings.
    Lower `priority` runs first; specific causes come before generic ones."""

    priority: int
    fn: Callable[[Evidence, list[Finding]], list[Finding]]
