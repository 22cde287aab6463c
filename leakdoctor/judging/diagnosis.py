"""From evidence to findings: the Evidence an investigation gathers, the rule runner, and the generic
rules that apply whatever the framework (an allocator cache, and the native_memory fallback).

Rules run in priority order; each sees the findings accepted before it, so a specific cause found by a
framework rule is not reported again by a generic one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from leakdoctor.integrations import MetricSpec, Rule
from leakdoctor.judging.detect import Trend
from leakdoctor.lifecycle.guard import Guard
from leakdoctor.reporting.summary import Finding, format_value

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
    notes: dict[str, str] = field(default_factory=dict)
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

    def rate(self, metric: str) -> float:
        trend = self.suspects.get(metric) or self.trends.get(metric)
        return trend.slope if trend else self.growth(metric) / self.steps

    def describe(self, metric: str) -> str:
        """'rss_bytes grew 1.2 MiB in 10 steps (120.0 KiB/step)': the growth the window saw and its own
        pace, which the trend's rate (the finding's) may differ from, said so where it does by twice."""
        unit = self.specs[metric].unit if metric in self.specs else "count"
        steps = self.steps if metric not in self.suspects or self.survives(metric) else self.last_span
        growth, trend = self.growth(metric), self.rate(metric)
        text = f"{metric} grew {format_value(growth, unit)} in {steps} steps ({format_value(growth / steps, unit)}/step"
        pace = growth / steps
        if trend and pace and not 0.5 <= trend / pace <= 2:
            text += f"; {format_value(trend, unit)}/step over the windows that raised the suspicion"
        return text + ")"

    def note(self, metric: str, text: str) -> None:
        """Say something about a metric in the summary's notes, without a finding."""
        self.notes[metric] = f"step {self.end_step}: {text}"

    def finding(self, cause: str, metric: str, *, evidence: str, recommendation: str,
                location: str | None = None, **extra: Any) -> Finding:
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


def diagnose(evidence: Evidence, rules: Sequence[Rule], guard: Guard) -> list[Finding]:
    """Run every rule in priority order; return the findings they accept."""
    accepted: list[Finding] = []
    for rule in sorted(rules, key=lambda r: r.priority):
        name = getattr(rule.fn, "__name__", "rule")
        accepted += guard.call(f"rule {name}", rule.fn, evidence, list(accepted), default=[]) or []
    return accepted


def allocator_cache(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Growth of memory that a cleanup rung took back is held by an allocator cache: benign. The C
    heap's own cache (only the settle rung took it back) is a note, and a finding only when its remedy
    is allowed to act on it."""
    found = []
    for metric in ev.unexplained(accepted):
        rung = ev.reclaimed_by(metric)
        if ev.specs[metric].unit != "bytes" or ev.survives(metric) or rung is None:
            continue
        evidence = f"{ev.describe(metric)}; {rung} took it back, so an allocator was caching freed memory"
        if rung in ev.end.settle and rung not in ev.remedies:
            ev.note(metric, f"not a leak: {evidence}")
            continue
        found.append(ev.finding(
            "allocator_cache", metric, benign=True, reclaimed_by=rung, evidence=evidence,
            recommendation=f"not a leak; if the cached memory is needed elsewhere, run {rung} periodically",
        ))
    return found


def fallback(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Memory that grows, survives every cleanup and that no specific rule explains."""
    found = []
    for metric in ev.unexplained(accepted):
        if ev.specs[metric].unit != "bytes" or not ev.survives(metric):
            continue
        native = metric == RSS
        if native and ev.refilled(metric):
            ev.note(metric, f"not a leak, nothing to fix: {ev.describe(metric)} as the program touched memory "
                            f"that malloc already held (pages a cleanup had given back to the system, or the "
                            f"free top of a thread's heap); nothing new was allocated: malloc's bytes in use "
                            f"and the mapped size stayed level")
            continue
        found.append(ev.finding(
            "native_memory" if native else "device_arrays", metric,
            evidence=f"{ev.describe(metric)}, survived cleanup, and no Python allocation or framework "
                     f"counter accounts for it",
            recommendation="look for native extensions or C libraries that allocate per step; run with "
                           "remedies='off' under a native profiler (memray --native, heaptrack)" if native else
                           "arrays on the device accumulate: look for results kept across steps",
        ))
    return found


GENERIC_RULES = [Rule(60, allocator_cache), Rule(100, fallback)]


def unexplained_notes(ev: Evidence, accepted: list[Finding]) -> list[str]:
    """What the rules noted, and confirmed growth that neither a finding nor a note accounts for."""
    silent = ev.unexplained(accepted)
    return list(ev.notes.values()) + [f"step {ev.end_step}: {ev.describe(m)}; leakdoctor could not tell what "
                                      f"holds it, so no finding was made" for m in silent]

