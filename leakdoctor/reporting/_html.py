"""The summary as one self-contained HTML page (`leakdoctor report S.json --html OUT.html`, `html_path=`, and
`Summary._repr_html_` in a notebook): the verdict and why, each finding (cause, place, fix, remedy and its
outcome, state) with the series that proved it drawn as inline SVG (_svg.py), every series, the run's
timeline (warm-up, growth, detection, remedies, stop, end), then notes, errors and the doctor's cost.

Nothing is fetched: the CSS is inline, the charts are SVG, there is no script, and the page's
Content-Security-Policy forbids any request. Every string from the summary is escaped (a file name or a
holder may hold markup). A program reads the page by its stable attributes, not its prose:
`data-section` on each part, `data-finding` (its index), `data-cause` and `data-state` on each finding,
`data-field` on each field (cause, state, severity, metric, rate, first-step, detected-step, location
with file, line, function and holder inside it, evidence, fix, reason, remedy with remedy-name,
remedy-step, outcome and rate-after inside it), `data-event`, `data-step` (and `data-for-finding`, the
index of its finding) on each event of the timeline, `data-series` on each chart (docs/html-report.md).
Pure functions: a summary in, a string out."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leakdoctor._base import messages
from leakdoctor._base.findings import proving
from leakdoctor._base.messages import location_text
from leakdoctor._base.schema import CAUSES, SCHEMA, STATES
from leakdoctor._base.units import format_value
from leakdoctor.reporting._files import write_atomic
from leakdoctor.reporting._plot import MARKED_CALLS, proof_panels, shown, title
from leakdoctor.reporting._svg import Mark, chart, text
from leakdoctor.reporting._text import ending_lines, overhead_line, supporting_line, why

if TYPE_CHECKING:
    from leakdoctor._base.findings import Finding, RemedyOutcome
    from leakdoctor.reporting._plot import PlottedSummary as Summary  # what the page reads of a summary

__all__ = ["render", "fragment", "write", "place", "events", "remedy_outcome"]

#: What each state means, said once under the findings so that the page reads without the README.
STATE_MEANINGS = {
    "leak": "grows and would matter over the horizon; no remedy stopped it",
    "remedied": "a remedy was applied and the growth stopped",
    "minor": "a proven cause, too slow to matter over the horizon (listed; the verdict stays clean)",
    "benign": "not a leak (an allocator cache that gives its memory back)",
    "withdrawn": "suspected while the run went on; the end of the run did not bear it out",
}
#: No request may leave the page: styles inline, images (none today) only as data: URLs.
POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def render(summary: "Summary") -> str:
    """The whole page: a standalone HTML document."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<meta name="generator" content="leakdoctor {text(summary.version)}">\n'
            f"<title>{text(title(summary).splitlines()[0])}</title>\n</head>\n<body>\n"
            f"{fragment(summary)}\n</body>\n</html>\n")


def fragment(summary: "Summary") -> str:
    """The report as one <div> with its own scoped style, for a page of its own (render) or a notebook's
    output cell (Summary._repr_html_), where its style must not touch the notebook's."""
    uid = "ld-" + hashlib.sha1(summary.to_json().encode()).hexdigest()[:10]  # anchors unique on a page of several
    parts = [_header(summary), _ending(summary), _findings(summary, uid), _series(summary),
             _timeline(summary, uid), _ranks(summary), _notes(summary)]
    return (f'<div class="leakdoctor-report" data-report="leakdoctor" data-schema="{SCHEMA}" '
            f'id="{uid}">\n<style>{STYLE}</style>\n' + "\n".join(p for p in parts if p) + "\n</div>")


def write(summary: "Summary", path: str | os.PathLike[str]) -> None:
    """Write the page to `path` atomically (a reader never sees half a file)."""
    write_atomic(Path(path), render(summary))


# --- the place of a finding --------------------------------------------------------------------------

#: 'val_losses in train() (train.py:42)', 'RecordsDataset.records (data.py:12)', with anything after it.
_HELD = re.compile(r"^(?P<holder>.+?) \((?P<file>[^()]+):(?P<line>\d+)\)(?P<rest>.*)$")
#: 'train.py:42'
_LINE = re.compile(r"^(?P<file>[^()]+):(?P<line>\d+)$")
#: 'val_losses in train()': a local variable in its function
_SCOPE = re.compile(r"^(?P<holder>.+) in (?P<function>[\w.<>]+)\(\)$")


def place(location: Any) -> dict[str, str | None]:
    """The finding's place as {file, line, function, holder} (None where unknown): a schema-2 record as
    it is, or one of the strings schema 1 writes ('train.py:42', 'val_losses in train() (train.py:42)',
    'jax.live_arrays(...)'), taken apart."""
    found: dict[str, str | None] = dict.fromkeys(("file", "line", "function", "holder"))
    if isinstance(location, dict):
        return {key: None if location.get(key) is None else str(location[key]) for key in found}
    if not location:
        return found
    location = str(location)
    match = _HELD.match(location) or _LINE.match(location)
    if match is None:
        found["holder"] = location
        return found
    parts = match.groupdict()
    found.update(file=parts["file"], line=parts["line"])
    holder = parts.get("holder")
    scoped = _SCOPE.match(holder) if holder else None
    found.update(holder=scoped["holder"] if scoped else holder, function=scoped["function"] if scoped else None)
    if parts.get("rest"):
        found["holder"] = f"{found['holder']}{parts['rest']}"
    return found


def _prose(value: Any) -> str:
    """A field of the summary as text: a record of the message catalogue rendered, a string as it is."""
    return "" if value is None else messages.render(value)


# --- the parts ------------------------------------------------------------------------------------------

def _header(summary: "Summary") -> str:
    facts = [("framework", summary.framework), ("steps", summary.steps), ("rank", summary.rank),
             ("leakdoctor", summary.version or "?"), ("written", summary.written_at or "never"),
             ("complete", "yes" if summary.complete else "no: the run had not finished")]
    rows = "".join(f'<dt>{name}</dt><dd data-field="{name}">{text(value)}</dd>' for name, value in facts)
    verdict = summary.verdict
    return (f'<header data-section="verdict"><h1>leakdoctor report</h1>'
            f'<p class="verdict {text(verdict)}">verdict: <strong data-field="verdict">{text(verdict)}</strong></p>'
            f'<p data-field="why">{text(why(summary))}</p><dl class="facts">{rows}</dl></header>')


def _ending(summary: "Summary") -> str:
    """How the run ended, when it is news: not finished, stopped before the limit, out of memory, unwatched."""
    items = [line.strip() for line in ending_lines(summary) if line.strip()]
    if summary.unwatched and not summary.leaks:
        items += [f"unwatched: {summary.unwatched.get('reason')}", f"fix: {summary.unwatched.get('fix')}"]
    if not items:
        return ""
    lines = "".join(f"<li>{text(line)}</li>" for line in items)
    return f'<section data-section="ending" class="alert"><h2>How the run ended</h2><ul>{lines}</ul></section>'


def _findings(summary: "Summary", uid: str) -> str:
    """Each finding, strongest state first (as the text table), with its index in the summary."""
    order = [(i, f) for state in (*STATES, None) for i, f in enumerate(summary.findings)
             if (f.final_state == state if state else f.final_state not in STATES)]
    if not order:
        return ('<section data-section="findings"><h2>Findings</h2>'
                '<p class="none">No finding: nothing grew that the doctor could not explain.</p></section>')
    body = "".join(_finding(i, f, summary, uid) for i, f in order)
    key = "".join(f"<dt>{s}</dt><dd>{text(m)}</dd>" for s, m in STATE_MEANINGS.items())
    return (f'<section data-section="findings"><h2>Findings ({len(order)})</h2>{body}'
            f'<details class="key"><summary>What the states mean</summary><dl>{key}</dl></details></section>')


def _finding(index: int, f: "Finding", summary: "Summary", uid: str) -> str:
    state = f.final_state
    rate = f"{format_value(f.rate_per_step, f.unit)}/step"
    rows = [_row("cause", "cause", f"{f.cause}: {CAUSES.get(f.cause, '')}", value=f.cause),
            _row("state", "state", state),
            _row("severity", "severity", f.severity or "-", value=f.severity or ""),
            _row("metric", "metric", f.metric),
            _row("rate", "rate", f"{rate} since step {f.first_step}", value=_number(f.rate_per_step)),
            _row("growth began", "first-step", f.first_step),
            _row("withdrawn" if state == "withdrawn" else "detected", "detected-step", f.detected_step),
            _place_row(f.location)]
    if state == "withdrawn":
        rows.append(_row("why withdrawn", "reason", _prose(f.reason)))
    rows += [_row("evidence", "evidence", _prose(f.evidence)), _row("fix", "fix", _prose(f.recommendation))]
    rows.append(_remedy_row(f.remedy, f.unit))
    rows += [_row("also seen on", "supporting", _supporting(other)) for other in f.supporting]
    heading = f"{state.upper()}: {f.cause} on {f.metric}, {rate}"
    return (f'<article class="finding {text(state)}" id="{uid}-finding-{index}" data-finding="{index}" '
            f'data-cause="{text(f.cause)}" data-state="{text(state)}"><h3>{text(heading)}</h3>'
            f'<dl>{"".join(rows)}</dl>{_proving_charts(f, summary)}</article>')


def _row(label: str, field: str, shown_text: Any, value: Any = None) -> str:
    data = "" if value is None else f' data-value="{text(value)}"'
    return f'<dt>{text(label)}</dt><dd data-field="{field}"{data}>{text(shown_text)}</dd>'


def _number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _place_row(location: Any) -> str:
    """'train.py:42 in train(), held by val_losses': each part in its own field, present but hidden (and
    empty) where unknown, so that a reader finds all four in every finding."""
    where = place(location)

    def part(key: str, before: str = "", after: str = "") -> str:
        value = where[key]
        hidden = "" if value else ' hidden=""'
        span = f'<span data-field="{key}"{hidden}>{text(value or "")}</span>'
        return f"{before}{span}{after}" if value else span

    said = (part("file") + part("line", before=":" if where["file"] else "line ")
            + part("function", before=" in " if where["file"] or where["line"] else "in ", after="()")
            + part("holder", before=", held by " if any(where[k] for k in ("file", "line", "function"))
                   else "held by "))
    unknown = "" if any(where.values()) else "unknown"
    return f'<dt>place</dt><dd data-field="location" data-value="{text(location_text(location) or "")}">{unknown}{said}</dd>'


def _remedy_row(remedy: "RemedyOutcome | None", unit: str) -> str:
    if remedy is None:
        return '<dt>remedy</dt><dd data-field="remedy" data-outcome="none">none applied</dd>'
    outcome = remedy_outcome(remedy)
    said = {"failed": f"failed: {remedy.error}", "effective": "effective: the growth stopped",
            "ineffective": "did not work: the growth went on",
            "unjudged": "applied too late in the run to judge"}[outcome]
    after = ("" if remedy.rate_after is None else
             f', then <span data-field="rate-after" data-value="{_number(remedy.rate_after)}">'
             f"{text(format_value(remedy.rate_after, unit))}</span>/step")
    detail = f' <span class="detail" data-field="remedy-detail">({text(_prose(remedy.detail))})</span>' if remedy.detail else ""
    return (f'<dt>remedy</dt><dd data-field="remedy" data-outcome="{outcome}">'
            f'<span data-field="remedy-name">{text(remedy.name)}</span> at step '
            f'<span data-field="remedy-step">{remedy.applied_step}</span>: '
            f'<span data-field="outcome" data-value="{outcome}">{text(said)}</span>{after}{detail}</dd>')


def remedy_outcome(remedy: "RemedyOutcome") -> str:
    """failed (it raised), effective (the growth stopped), ineffective, or unjudged (too late to tell)."""
    return "failed" if remedy.error else {True: "effective", False: "ineffective", None: "unjudged"}[remedy.effective]


def _supporting(other: dict[str, Any]) -> str:
    return supporting_line(other)


def _marks(f: "Finding", last_step: int) -> list[Mark]:
    """A finding's marks: its onset, its detection, and its remedy's span to the end of the run."""
    seen = "suspected" if f.final_state == "withdrawn" else "detected"
    marks = [Mark("onset", f.first_step, f"{f.cause}: growth began (step {f.first_step})"),
             Mark("detected", f.detected_step, f"{f.cause}: {seen} (step {f.detected_step})")]
    remedy = f.remedy
    if remedy is not None:
        worked = {True: "effective", False: "did not work", None: "not judged"}[remedy.effective]
        kind = "remedy" if remedy.effective else "remedy-failed"
        marks.append(Mark(kind, remedy.applied_step, f"after {remedy.name} (step {remedy.applied_step}): {worked}",
                          until=max(last_step, remedy.applied_step + 1)))
    return marks


def _run_marks(summary: "Summary") -> list[Mark]:
    stop = summary.stopped or {}
    step = stop.get("step")
    return [Mark("stopped", step, f"stopped before the memory limit (step {step})")] if isinstance(step, int) else []


def _series_chart(name: str, summary: "Summary", marks: list[Mark]) -> str:
    s = summary.series[name]
    return chart(name, s.unit, s.points, marks, warmup=_warmup(summary), last_step=summary.steps,
                 caption=f"{name}: {s.trend_text}")


def _warmup(summary: "Summary") -> int:
    warmup = summary.settings.get("warmup")
    return warmup if isinstance(warmup, int) and not isinstance(warmup, bool) and warmup > 0 else 0


def _proving_charts(f: "Finding", summary: "Summary") -> str:
    """The series that proved the finding, each with the finding's marks; then what its investigation read
    that no series holds (the proof records)."""
    marks = _marks(f, summary.steps) + _run_marks(summary)
    charts = [_series_chart(name, summary, marks) for name in proving(f, summary.series)]
    charts += [chart(str(record.get("name", "proof")), str(record.get("unit", "count")), record["points"], marks,
                     last_step=summary.steps, caption=f"{record.get('name', 'proof')}: read by its investigation")
               for finding, record in proof_panels(summary) if finding is f]
    if not charts:
        return ""
    return f'<div class="proving" data-field="series"><h4>The series that proved it</h4>{"".join(charts)}</div>'


def _series(summary: "Summary") -> str:
    """Every series as the text table reads it, then a chart of each worth showing (as the PNG's panels)
    that no finding above has drawn already."""
    if not summary.series:
        return '<section data-section="series"><h2>Series</h2><p class="none">no series recorded</p></section>'
    head = "".join(f"<th>{h}</th>" for h in ("metric", "after warm-up", "end", "peak", "per step", "trend"))
    rows = "".join(
        f'<tr data-metric="{text(name)}" data-trend="{text(s.trend)}"><td>{text(name)}</td>'
        + "".join(f"<td>{text(format_value(v, s.unit))}</td>" for v in (s.start, s.end, s.peak, s.slope_per_step))
        + f"<td>{text(s.trend_text)}</td></tr>" for name, s in summary.series.items())
    drawn = {name for f in summary.findings for name in _proving(f, summary)}
    charts = [_series_chart(name, summary, _run_marks(summary)) for name in shown(summary) if name not in drawn]
    return (f'<section data-section="series"><h2>Series</h2><table><thead><tr>{head}</tr></thead>'
            f'<tbody>{rows}</tbody></table>{"".join(charts)}</section>')


def _proving(f: "Finding", summary: "Summary") -> list[str]:
    return proving(f, summary.series)


# --- the timeline ------------------------------------------------------------------------------------

#: The order of events at the same step: the run's own first, then a growth before its detection.
_ORDER = {"start": 0, "warmup": 1, "onset": 2, "detected": 3, "remedy": 4, "call": 5, "stopped": 6, "oom": 7,
          "end": 8}


def events(summary: "Summary") -> list[tuple[int, str, str, int | None]]:
    """The run's timeline: (step, event, what happened, the finding's index or None), in step order."""
    found: list[tuple[int, str, str, int | None]] = [(0, "start", "the doctor started watching", None)]
    warmup = _warmup(summary)
    if warmup:
        found.append((warmup, "warmup", f"warm-up ended: steps 0-{warmup} are not judged", None))
    for i, f in enumerate(summary.findings):
        seen = "suspected" if f.final_state == "withdrawn" else "detected"
        found.append((f.first_step, "onset", f"{f.cause} on {f.metric}: growth began", i))
        found.append((f.detected_step, "detected", f"{f.cause} on {f.metric}: {seen}; in the end: {f.final_state}", i))
        if f.remedy is not None:
            said = f"remedy {f.remedy.name} applied for {f.cause}: {remedy_outcome(f.remedy)}"
            found.append((f.remedy.applied_step, "remedy", said, i))
    calls = summary.calls or []
    if 1 < len(calls) <= MARKED_CALLS:
        found += [(c["last_step"], "call", f"{c.get('kind', 'call')} call {c.get('call', n)} ended", None)
                  for n, c in enumerate(calls) if isinstance(c, dict) and isinstance(c.get("last_step"), int)]
    if summary.stopped and isinstance(summary.stopped.get("step"), int):
        found.append((summary.stopped["step"], "stopped",
                      f"stopped before the memory limit: {summary.stopped.get('reason', '')}", None))
    if summary.oom and isinstance(summary.oom.get("step"), int):
        what = "out of memory imminent" if summary.oom.get("imminent") else "out of memory"
        found.append((summary.oom["step"], "oom", what, None))
    end = (f"the run ended after {summary.steps} steps" if summary.complete else
           f"the last summary written ({summary.written_at or 'a snapshot'}): the run had not finished")
    found.append((summary.steps, "end", end, None))
    return sorted(found, key=lambda e: (e[0], _ORDER[e[1]]))


def _timeline(summary: "Summary", uid: str) -> str:
    items = []
    for step, event, said, index in events(summary):
        link = f' (<a href="#{uid}-finding-{index}">finding {index + 1}</a>)' if index is not None else ""
        finding = f' data-for-finding="{index}"' if index is not None else ""
        items.append(f'<li class="event {event}" data-event="{event}" data-step="{step}"{finding}>'
                     f'<span class="step">step {step}</span> {text(said)}{link}</li>')
    return f'<section data-section="timeline"><h2>Timeline</h2><ol class="timeline">{"".join(items)}</ol></section>'


# --- the rest --------------------------------------------------------------------------------------------

def _ranks(summary: "Summary") -> str:
    if not summary.ranks:
        return ""
    rows = "".join(f'<tr data-rank="{text(r.get("rank"))}"><td>{text(r.get("rank"))}</td>'
                   f'<td>{text(r.get("verdict"))}</td><td>{len(r.get("findings", []))}</td>'
                   f'<td>{text(r.get("file") or "")}</td></tr>' for r in summary.ranks)
    return (f'<section data-section="ranks"><h2>Ranks</h2><table><thead><tr><th>rank</th><th>verdict</th>'
            f'<th>findings</th><th>file</th></tr></thead><tbody>{rows}</tbody></table></section>')


def _notes(summary: "Summary") -> str:
    items = [f'<li data-field="note">{text(_prose(n))}</li>' for n in summary.notes]
    items += [f'<li data-field="error">switched off: {text(e.get("part"))}: {text(e.get("error"))}</li>'
              for e in summary.errors]
    if summary.projected_limit_step is not None:
        limit = summary.memory_limit or {}
        size = f" ({format_value(limit['bytes'], 'bytes')}, {limit.get('source')})" if limit.get("bytes") else ""
        items.append(f'<li data-field="projection" data-step="{summary.projected_limit_step}">projected to reach the '
                     f"memory limit{text(size)} at step {summary.projected_limit_step}</li>")
    line = overhead_line(summary.overhead)
    if line:
        items.append(f'<li data-field="overhead">{text(line)}</li>')
    settings = ", ".join(f"{k}={v}" for k, v in summary.settings.items())
    if settings:
        items.append(f'<li data-field="settings">settings: {text(settings)}</li>')
    if not items:
        return ""
    return f'<section data-section="notes"><h2>Notes</h2><ul>{"".join(items)}</ul></section>'


STYLE = """
.leakdoctor-report{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;
 max-width:980px;margin:0 auto;padding:12px 16px}
.leakdoctor-report h1{font-size:22px;margin:0 0 6px}
.leakdoctor-report h2{font-size:18px;margin:22px 0 8px;border-bottom:1px solid #d8dce4;padding-bottom:3px}
.leakdoctor-report h3{font-size:15px;margin:0 0 8px}
.leakdoctor-report h4{font-size:13px;margin:10px 0 4px;color:#4a5263}
.leakdoctor-report .verdict{font-size:18px;margin:4px 0}
.leakdoctor-report .verdict strong{text-transform:uppercase;padding:1px 8px;border-radius:4px;color:#fff;
 background:#6b7280}
.leakdoctor-report .verdict.leak strong{background:#c0262d}
.leakdoctor-report .verdict.remedied strong{background:#1f7a3a}
.leakdoctor-report .verdict.clean strong{background:#1f7a3a}
.leakdoctor-report .verdict.unwatched strong{background:#a15c00}
.leakdoctor-report dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0}
.leakdoctor-report dt{color:#5b6475;font-weight:600}
.leakdoctor-report dd{margin:0;overflow-wrap:anywhere}
.leakdoctor-report .facts{grid-template-columns:repeat(6,max-content auto);font-size:13px}
.leakdoctor-report .alert{border-left:4px solid #c0262d;background:#fdf1f1;padding:2px 12px}
.leakdoctor-report .finding{border:1px solid #d8dce4;border-left:5px solid #6b7280;border-radius:4px;
 padding:10px 12px;margin:10px 0}
.leakdoctor-report .finding.leak{border-left-color:#c0262d}
.leakdoctor-report .finding.remedied{border-left-color:#1f7a3a}
.leakdoctor-report .finding.minor{border-left-color:#d97706}
.leakdoctor-report .finding.benign{border-left-color:#2563eb}
.leakdoctor-report [data-field=location] span[data-field=file],.leakdoctor-report [data-field=fix]{
 font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px}
.leakdoctor-report table{border-collapse:collapse;font-size:13px;margin:6px 0}
.leakdoctor-report th,.leakdoctor-report td{border-bottom:1px solid #e5e7eb;padding:2px 10px;text-align:left}
.leakdoctor-report .chart{margin:8px 0}
.leakdoctor-report .chart svg{width:100%;height:auto;max-width:720px;display:block}
.leakdoctor-report figcaption{font-size:13px;font-weight:600}
.leakdoctor-report .frame{fill:none;stroke:#9aa3b2;stroke-width:.8}
.leakdoctor-report .grid{stroke:#e5e7eb;stroke-width:.8}
.leakdoctor-report .tick{font-size:11px;fill:#4a5263}
.leakdoctor-report .series{fill:none;stroke:#7e22ce;stroke-width:1.4}
.leakdoctor-report .warmup{fill:#e5e7eb}
.leakdoctor-report .band.remedy{fill:#16a34a;fill-opacity:.13}
.leakdoctor-report .band.remedy-failed{fill:#f59e0b;fill-opacity:.15}
.leakdoctor-report .mark{stroke-width:1.4}
.leakdoctor-report .mark.onset{stroke:#c0262d;stroke-dasharray:2 3}
.leakdoctor-report .mark.detected{stroke:#c0262d;stroke-dasharray:6 3}
.leakdoctor-report .mark.remedy{stroke:#16a34a}
.leakdoctor-report .mark.remedy-failed{stroke:#d97706}
.leakdoctor-report .mark.stopped{stroke:#111;stroke-width:2}
.leakdoctor-report .legend{list-style:none;padding:0;margin:2px 0 0;font-size:12px;display:flex;flex-wrap:wrap;
 gap:2px 14px}
.leakdoctor-report .legend .key::before{content:"";display:inline-block;width:14px;height:0;margin-right:5px;
 vertical-align:middle;border-top:2px solid #7e22ce}
.leakdoctor-report .legend .warmup::before{border-top:8px solid #e5e7eb}
.leakdoctor-report .legend .onset::before{border-top:2px dotted #c0262d}
.leakdoctor-report .legend .detected::before{border-top:2px dashed #c0262d}
.leakdoctor-report .legend .remedy::before{border-top:8px solid #bbe5c8}
.leakdoctor-report .legend .remedy-failed::before{border-top:8px solid #fcdca7}
.leakdoctor-report .legend .stopped::before{border-top:2px solid #111}
.leakdoctor-report .timeline{list-style:none;padding-left:0;border-left:2px solid #d8dce4;margin-left:6px}
.leakdoctor-report .timeline li{padding:2px 0 2px 12px;position:relative}
.leakdoctor-report .timeline li::before{content:"";position:absolute;left:-6px;top:9px;width:10px;height:10px;
 border-radius:50%;background:#9aa3b2}
.leakdoctor-report .timeline .detected::before,.leakdoctor-report .timeline .oom::before,
.leakdoctor-report .timeline .stopped::before{background:#c0262d}
.leakdoctor-report .timeline .remedy::before{background:#16a34a}
.leakdoctor-report .step{display:inline-block;min-width:88px;color:#5b6475;font-variant-numeric:tabular-nums}
.leakdoctor-report .none{color:#5b6475}
.leakdoctor-report details.key{font-size:13px;margin-top:6px}
"""
