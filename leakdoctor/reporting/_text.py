"""The summary as the table printed at the end of a run (`Summary.text()`, `leakdoctor report`), and the
lines of it that the HTML page shows too: why the verdict, how the run ended, the doctor's cost."""

from __future__ import annotations

from typing import Any

from leakdoctor._base.findings import Finding, RemedyOutcome, SeriesSummary, known_fields, proving
from leakdoctor._base.messages import render
from leakdoctor._base.schema import STATES
from leakdoctor._base.units import format_value

__all__ = ["render_text", "why", "ending_lines", "overhead_line", "supporting_line", "step_time_line"]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def render_text(summary: Any) -> str:
    """The table printed at the end of a run: the verdict and why first, the series, then each finding
    under its state."""
    lines = ending_lines(summary)
    lines.append(f"leakdoctor: {summary.framework}, {summary.steps} steps, verdict {summary.verdict.upper()}")
    lines.append(f"  why: {why(summary)}")
    rows = [["metric", "after warm-up", "end", "peak", "per step", "trend"]]
    for name, s in summary.series.items():
        rows.append([name] + [format_value(v, s.unit) for v in (s.start, s.end, s.peak, s.slope_per_step)] + [s.trend_text])
    lines += _table(rows) if len(rows) > 1 else []
    for state in STATES:
        for f in (f for f in summary.findings if f.final_state == state):
            lines += [""] + _finding_lines(f) + _proving_lines(f, summary.series)
    for name, label in (("step_seconds", "step time"), ("step_cpu_seconds", "CPU time per step")):
        line = step_time_line(label, summary.series.get(name))
        lines += [line] if line else []
    for r in summary.ranks:
        lines.append(f"rank {r.get('rank')}: verdict {r.get('verdict')}, {len(r.get('findings', []))} finding(s)")
    if summary.projected_limit_step is not None:
        limit = summary.memory_limit or {}
        figure = f", against {limit['figure']}" if limit.get("figure") not in (None, "rss_bytes") else ""
        of = f" ({format_value(limit['bytes'], 'bytes')}, {limit['source']}{figure})" if limit.get("bytes") else ""
        lines.append(f"\nprojected to reach the memory limit{of} at step {summary.projected_limit_step}")
    lines += [f"note: {render(n)}" for n in summary.notes]
    lines += [f"switched off: {e['part']}: {e['error']}" for e in summary.errors]
    line = overhead_line(summary.overhead)
    return "\n".join(lines + ([line] if line else []))


def overhead_line(overhead: dict[str, float]) -> str | None:
    """'overhead: 2.10% of the run's time (step() 0.40%, 1 investigation(s) and the last look 1.70%; a
    sample every 4 step(s): ...)': the total first, then its parts (the last look at finish() and an
    investigation concluded there count with the investigations). Summaries written before the total was
    kept give the share of step time alone."""
    stride, latency = overhead.get("sample_stride"), overhead.get("latency_steps")
    paced = f"a sample every {stride} step(s): a fast leak is found within ~{latency} steps" if latency else ""
    run, total = overhead.get("run_seconds"), overhead.get("total_seconds")
    if run and total is not None:
        thread = overhead.get("thread_cpu_seconds")
        parts = (f"step() {overhead.get('probe_seconds', 0.0) / run:.2%}, "
                 + (f"sampler thread {thread / run:.2%}, " if thread else "")
                 + f"{overhead.get('investigations', 0):g} investigation(s) and the last look "
                   f"{overhead.get('forensic_seconds', 0.0) / run:.2%}")
        return f"overhead: {total / run:.2%} of the run's time ({parts}{'; ' + paced if paced else ''})"
    share = overhead.get("fraction_of_step_time")
    if share is None:
        return None
    return f"overhead: {share:.2%} of step time{f' ({paced})' if paced else ''}"


#: A step time below this (10 µs) is at the clocks' resolution: no percentage is reckoned from it.
MEANINGFUL_SECONDS = 1e-5
#: A rise beyond this ratio is said in absolute terms only: "+2343%" from a near-empty step says nothing.
MEANINGFUL_RATIO = 10.0


def step_time_line(label: str, series: SeriesSummary | None) -> str | None:
    """'step time rose from 5.2 ms to 6.1 ms (+17%)' when the series grows and its end is above its start;
    the percentage only where both ends are meaningful (a start above the clock's resolution, a rise
    less than tenfold); a growing trend whose last reading is no higher is said as a trend, not a rise."""
    if series is None or not series.grows or series.end is None or series.start is None:
        return None
    start, end = format_value(series.start, "seconds"), format_value(series.end, "seconds")
    if series.end <= series.start:
        return (f"{label} trended up ({format_value(series.slope_per_step, 'seconds')}/step over the run), though "
                f"its last reading ({end}) is no higher than its first after warm-up ({start})")
    meaningful = series.start >= MEANINGFUL_SECONDS and series.end <= MEANINGFUL_RATIO * series.start
    change = f" ({series.end / series.start - 1:+.0%})" if meaningful else ""
    return f"{label} rose from {start} to {end}{change}"


def why(summary: Any) -> str:
    """The verdict's reason in one line."""
    if summary.stopped:
        return f"stopped at step {summary.stopped.get('step')} before the memory limit"
    leaks = summary.leaks
    if leaks:
        return "; ".join(f"{f.final_state} {f.cause}" + (f" at {f.where}" if f.location else "") for f in leaks)
    if summary.unwatched:
        return f"{summary.unwatched.get('reason')}; {summary.unwatched.get('fix')}"
    minor = summary.minor
    return f"watched {summary.steps} steps and found no leak that matters" + (
        f" ({len(minor)} minor finding(s) listed below)" if minor else "")


def _finding_lines(f: Finding) -> list[str]:
    state = f.final_state
    lines = [f"[{state.upper()}] {f.cause} on {f.metric}: {format_value(f.rate_per_step, f.unit)}/step since step "
             f"{f.first_step}" + (f" (suspected at step {f.detected_step})" if state == "withdrawn" else "")]
    if state == "withdrawn":
        return lines + [f"  why withdrawn: {render(f.reason)}"]
    if f.location:
        lines.append(f"  where: {f.where}")
    lines.append(f"  evidence: {f.evidence_text}")
    if f.detected_rate is not None and f.rate_per_step and not 0.5 <= f.detected_rate / f.rate_per_step <= 2:
        lines.append(f"  rate: {format_value(f.detected_rate, f.unit)}/step when found at step {f.detected_step}, "
                     f"refit over the whole run since step {f.first_step}")
    lines.append(f"  fix: {f.recommendation_text}")
    if f.remedy:
        lines.append(f"  remedy: {_remedy_line(f.remedy, f.unit)}")
    lines += [f"  also: {supporting_line(other)}" for other in f.supporting]
    return lines


def _proving_lines(f: Finding, series: dict[str, SeriesSummary]) -> list[str]:
    """'  series: len(outputs) 25 -> 400 (1/step, growing)': the series that proved it, as the table reads them."""
    shown = []
    for name in proving(f, series):
        s = series[name]
        shown.append(f"{name} {format_value(s.start, s.unit)} -> {format_value(s.end, s.unit)} "
                     f"({format_value(s.slope_per_step, s.unit)}/step, {s.trend_text})")
    for record in f.proof:
        points = record.get("points") or []
        if len(points) >= 2:
            unit = record.get("unit", "count")
            shown.append(f"{record.get('name')} {format_value(points[0][1], unit)} -> {format_value(points[-1][1], unit)} "
                         f"over steps {points[0][0]}-{points[-1][0]} (its investigation)")
    return [f"  series: {'; '.join(shown)}"] if shown else []


def supporting_line(other: dict[str, Any]) -> str:
    """'rss_bytes 130.7 KiB/step since step 190 (leak); remedy clear_cache at step 300, effective': what
    another metric showed of the same cause at the same place."""
    text = (f"{other.get('metric')} {format_value(other.get('rate_per_step'), other.get('unit') or 'count')}/step "
            f"since step {other.get('first_step')} ({other.get('state')})")
    remedy = other.get("remedy")
    if remedy:
        text += f"; remedy {_remedy_line(RemedyOutcome(**known_fields(RemedyOutcome, remedy)), other.get('unit') or 'count')}"
    return text


def ending_lines(summary: Any) -> list[str]:
    """How the run ended, when that comes first: not at all yet (a summary written while it went on),
    stopped before the memory limit, out of memory, or about to run out of it."""
    lines = []
    if not summary.complete:
        when = f"last written at {summary.written_at}" if summary.written_at else "a snapshot taken"
        lines.append(f"INCOMPLETE: the run did not finish: this summary was {when}, at step {summary.steps}, while "
                     f"the run went on (it was killed, or is still running)")
    if summary.stopped:
        stop = summary.stopped
        lines.append(f"STOPPED at step {stop['step']} before the memory limit: {stop['reason']}")
        lines.append(f"  checkpoint: {stop.get('checkpoint') or 'none saved'}")
        by = summary.stopped_by
        if by and by.get("rank") is not None:
            lines.append(f"  asked by rank {by['rank']}" + (f" at step {by['step']}" if by.get("step") is not None
                                                           else "") + "; every rank stopped at the same step")
    if summary.oom:
        oom = summary.oom
        if oom.get("imminent"):
            source = f" ({oom['limit_source']})" if oom.get("limit_source") else ""
            figure = oom.get("figure") or "rss_bytes"
            what = "resident memory" if figure == "rss_bytes" else figure
            lines.append(f"OUT OF MEMORY IMMINENT at step {oom['step']}: {what} "
                         f"{format_value(oom.get(figure), 'bytes')} of the memory limit "
                         f"{format_value(oom.get('limit_bytes'), 'bytes')}{source}")
        else:
            lines.append(f"OUT OF MEMORY at step {oom['step']}: {oom['error']}")
        for row in oom.get("growing", []):
            lines.append(f"  growing: {row['metric']} {format_value(row['slope_per_step'], 'bytes')}/step "
                         f"since step {row['since_step']}")
        for site in oom.get("sites", []):
            what = f"{site['count']} x {site['tensors']}" if site.get("tensors") else f"{site['count']} allocations"
            lines.append(f"  allocated: {site.get('location') or '?'}: {what}, +{format_value(site['bytes'], 'bytes')} "
                         f"({site['seen_by']}, step {site['step']})")
        if oom.get("snapshot"):
            lines.append(f"  CUDA allocator snapshot: {oom['snapshot']} (open it at https://pytorch.org/memory_viz)")
    return lines + ([""] if lines else [])


def _remedy_line(outcome: RemedyOutcome, unit: str) -> str:
    if outcome.error:
        return f"{outcome.name} failed at step {outcome.applied_step}: {outcome.error}"
    state = {True: "effective", False: "INEFFECTIVE", None: "applied too late in the run to judge"}[outcome.effective]
    after = f", {format_value(outcome.rate_after, unit)}/step after" if outcome.rate_after is not None else ""
    return f"{outcome.name} at step {outcome.applied_step}, {state}{after}"
