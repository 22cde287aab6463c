"""From evidence to findings: the rule runner, and the generic rules that apply whatever the framework (an
allocator cache, and the native_memory fallback). The Evidence they read, and what a Rule is, are in
the ground floor's _base/evidence.py, which the integrations' rules import too.

Rules run in priority order; each sees the findings accepted before it, so a specific cause found by a
framework rule is not reported again by a generic one.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from leakdoctor._base.evidence import RSS, Evidence, Rule
from leakdoctor._base.messages import Record, msg
from leakdoctor._base.findings import Finding
from leakdoctor._base.guard import Guard


def diagnose(evidence: Evidence, rules: Sequence[Rule], guard: Guard) -> list[Finding]:
    """Run every rule in priority order; return the findings they accept, each proven cause its own finding
    with its own rate where several share a metric (shared_rates)."""
    accepted: list[Finding] = []
    for rule in sorted(rules, key=lambda r: r.priority):
        name = getattr(rule.fn, "__name__", "rule")
        accepted += guard.call(f"rule {name}", rule.fn, evidence, list(accepted), default=[]) or []
    return shared_rates(evidence, accepted)


def shared_rates(ev: Evidence, findings: list[Finding]) -> list[Finding]:
    """Findings that share a metric (two leaks in one loop both grow resident memory) each get their own
    rate, not the metric's: one whose evidence measured its bytes in the window, those bytes a step; the
    others, what is left of the metric's rate, shared evenly. A finding alone on its metric keeps it."""
    out = list(findings)
    for metric in dict.fromkeys(f.metric for f in findings):
        sharing = [i for i, f in enumerate(findings) if f.metric == metric and not f.benign]
        if len(sharing) < 2:
            continue
        own = {i: findings[i].accounts[metric] / ev.steps for i in sharing if metric in findings[i].accounts}
        rest = [i for i in sharing if i not in own]
        left = max(0.0, ev.rate(metric) - sum(own.values())) / len(rest) if rest else 0.0
        for i in sharing:
            rate = own.get(i, left)
            out[i] = dataclasses.replace(findings[i], rate_per_step=rate, detected_rate=rate, rate_interval=None)
    return out


def allocator_cache(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
    """Growth of memory that a cleanup rung took back is held by an allocator cache: benign. The C
    heap's own cache (only the settle rung took it back) is a note, and a finding only when its remedy
    is allowed to act on it."""
    found = []
    for metric in ev.unexplained(accepted):
        rung = ev.reclaimed_by(metric)
        if ev.specs[metric].unit != "bytes" or ev.survives(metric) or rung is None:
            continue
        evidence = msg("cleanup_took_back", growth=ev.describe(metric), rung=rung)
        if rung in ev.end.settle and rung not in ev.remedies:
            ev.note(metric, msg("not_a_leak", why=evidence))
            continue
        found.append(ev.finding(
            "allocator_cache", metric, benign=True, reclaimed_by=rung, evidence=evidence,
            recommendation=msg("run_rung_periodically", rung=rung),
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
            ev.note(metric, msg("refilled", growth=ev.describe(metric)))
            continue
        if not ev.matters_at_low_end(metric):
            ev.note(metric, msg("unproven_and_slow", growth=ev.describe(metric)))
            continue
        found.append(ev.finding(
            "native_memory" if native else "device_arrays", metric,
            evidence=msg("nothing_accounts", growth=ev.describe(metric)),
            recommendation=msg("native_profiler") if native else msg("device_results_kept"),
        ))
    return found


GENERIC_RULES = [Rule(60, allocator_cache), Rule(100, fallback)]


def unexplained_notes(ev: Evidence, accepted: list[Finding]) -> list[Record]:
    """What the rules noted, and confirmed growth that neither a finding nor a note accounts for."""
    silent = ev.unexplained(accepted)
    return list(ev.notes.values()) + [msg("at_step", step=ev.end_step, note=msg("no_holder", growth=ev.describe(m)))
                                      for m in silent]

