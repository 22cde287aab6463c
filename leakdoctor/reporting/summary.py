"""The end-of-run report: findings, series, verdict; rendered as JSON (schema leakdoctor.summary/2, whose
names are base/schema.py's; /1 is still read), as a text table, and (with the [plot] extra) as a PNG (plot.py). Read back from a
file with Summary.load, which loading.py checks first. A Summary is made of the ground floor's Finding,
RemedyOutcome and SeriesSummary (leakdoctor/base/findings.py), which this module also exports."""

from __future__ import annotations

import glob
import json
import math
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from leakdoctor.base.findings import Finding, RemedyOutcome, SeriesSummary, known_fields, proving
from leakdoctor.base.messages import Record, legacy, render
from leakdoctor.base.schema import OLD_SCHEMAS, SCHEMA, STATES
from leakdoctor.base.units import format_value
from leakdoctor.reporting.loading import read
from leakdoctor.reporting.plot import plot_summary

__all__ = ["Summary", "Finding", "RemedyOutcome", "SeriesSummary", "verdict_of", "format_value", "render_text",
           "step_time_line", "proving", "write_atomic", "now_iso"]


def verdict_of(findings: list[Finding]) -> str:
    """clean: no major leak (minor, benign and withdrawn findings are listed only); remedied: every major
    leak had an effective remedy; leak: otherwise."""
    leaks = [f for f in findings if f.counts]
    if not leaks:
        return "clean"
    return "remedied" if all(f.final_state == "remedied" for f in leaks) else "leak"


@dataclass
class Summary:
    """The leak summary of one run (or, with `ranks`, of all ranks of a distributed run)."""

    framework: str
    steps: int
    series: dict[str, SeriesSummary]
    findings: list[Finding]
    projected_limit_step: int | None = None
    overhead: dict[str, float] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    #: records of the message catalogue (base/messages.py): what no field says
    notes: list[Record] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    rank: int = 0
    version: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    memory_limit: dict[str, Any] | None = None
    stopped: dict[str, Any] | None = None
    #: In a distributed run that on_limit="stop" ended: the rank that asked every rank to stop, the step it
    #: asked at and why ({"rank", "step", "reason"}; step and reason None where this rank does not know).
    stopped_by: dict[str, Any] | None = None
    oom: dict[str, Any] | None = None
    unwatched: dict[str, Any] | None = None
    #: False for a summary of a run still going (a heartbeat's, an OOM watermark's, a snapshot): a file
    #: left so by a run that was killed (SIGKILL, the out-of-memory killer) says the run did not finish.
    complete: bool = True
    #: When it was last written to a file (ISO 8601, local time with its offset); None if never.
    written_at: str | None = None
    #: Where the steps are batches of several calls (Keras fits): each call, marked on the clock of steps
    #: ({"call", "kind", "first_step", "last_step"}); None where a step is a step of one loop.
    calls: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.notes = [legacy(note) for note in self.notes]  # text (an old file, a caller's own) as a record

    @property
    def verdict(self) -> str:
        """As verdict_of; a run that on_limit stopped had a leak, whatever its findings became; a run
        without a leak that was not watched long enough to judge (`unwatched`: reason, fix) is unwatched."""
        if self.stopped:
            return "leak"
        verdict = verdict_of(self.findings)
        return "unwatched" if verdict == "clean" and self.unwatched else verdict

    @property
    def leaks(self) -> list[Finding]:
        """The findings that make the verdict: major leaks, remedied or not."""
        return [f for f in self.findings if f.counts]

    def fails(self, on: str = "major") -> bool:
        """Does a CI gate fail on this run? On a leak; with `on="minor"`, also on a minor finding that no
        remedy stopped. An unwatched run is no leak (`leakdoctor report` gives it its own exit status)."""
        return self.verdict == "leak" or (on == "minor" and bool(self.unremedied_minor))

    @property
    def minor(self) -> list[Finding]:
        """Proven causes too slow to matter over the horizon (listed; the verdict stays clean)."""
        return [f for f in self.findings if f.severity == "minor" and f.final_state in ("minor", "remedied")]

    @property
    def unremedied_minor(self) -> list[Finding]:
        """The minor findings no remedy stopped: what `fails(on="minor")` and the pytest plugin fail on."""
        return [f for f in self.minor if f.final_state == "minor"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": self.version,
            "framework": self.framework,
            "rank": self.rank,
            "steps": self.steps,
            "verdict": self.verdict,
            "series": {name: asdict(s) for name, s in self.series.items()},
            "findings": [f.to_dict() for f in self.findings],
            "projected_limit_step": self.projected_limit_step,
            "overhead": dict(self.overhead),
            "ranks": list(self.ranks),
            "notes": list(self.notes),  # records (base/messages.py): `leakdoctor report` renders them
            "errors": list(self.errors),
            "settings": dict(self.settings),
            "memory_limit": self.memory_limit,
            "complete": self.complete,
            "written_at": self.written_at,
            **{key: value for key, value in (("stopped", self.stopped), ("stopped_by", self.stopped_by),
                                             ("oom", self.oom),
                                             ("unwatched", self.unwatched), ("calls", self.calls))
               if value is not None},
        }

    def to_json(self) -> str:
        """Strict JSON: a NaN or infinite number is written as null (JSON has no NaN or Infinity)."""
        return json.dumps(_strict(self.to_dict()), indent=2, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Summary":
        if data.get("schema") not in (SCHEMA, *OLD_SCHEMAS):
            raise ValueError(f"not a leakdoctor summary: schema {data.get('schema')!r}, expected {SCHEMA!r}")
        series = {
            name: SeriesSummary(**{**known_fields(SeriesSummary, s), "points": [tuple(p) for p in s.get("points", [])]})
            for name, s in data["series"].items()
        }
        return cls(
            framework=data["framework"],
            steps=data["steps"],
            series=series,
            findings=[Finding.from_dict(f) for f in data["findings"]],
            projected_limit_step=data.get("projected_limit_step"),
            overhead=data.get("overhead", {}),
            ranks=data.get("ranks", []),
            notes=data.get("notes", []),
            errors=data.get("errors", []),
            rank=data.get("rank", 0),
            version=data.get("version", ""),
            settings=data.get("settings", {}),
            memory_limit=data.get("memory_limit"),
            stopped=data.get("stopped"),
            stopped_by=data.get("stopped_by"),
            oom=data.get("oom"),
            unwatched=data.get("unwatched"),
            complete=data.get("complete", True),  # files older than the field were written at the end
            written_at=data.get("written_at"),
            calls=data.get("calls"),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Summary":
        """Read a summary file, checked and with strings safe to print (loading.py); a ValueError
        (SummaryFileError) with a one-line message if it is not one."""
        return cls.from_dict(read(path))

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON atomically: a reader never sees half a file. `written_at` is set to now."""
        self.written_at = now_iso()
        write_atomic(Path(path), self.to_json() + "\n")

    def text(self) -> str:
        return render_text(self)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Write the PNG of the run (needs matplotlib: the [plot] extra)."""
        plot_summary(self, path)


def _strict(value: Any) -> Any:
    """`value` with numpy scalars made Python numbers and non-finite floats made None, all the way down."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, (str, int)):
        return _strict(value.item())
    return value


#: A temporary file of a write older than this (a write takes milliseconds) and older than this process
#: was left by a writer killed in the middle (SIGKILL, power loss); the next write removes it.
STALE_SECONDS = 60.0
_LOADED = time.time()


def now_iso() -> str:
    """The time now as ISO 8601, local time with its UTC offset, to the second: '2025-01-31T14:03:07+01:00'."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a reader never sees half
    a file. The file's mode is what the umask makes of 0666, as for open(). Stale temporary files of
    earlier writes to `path` that were killed are removed first."""
    remove_stale(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale(path: Path) -> None:
    """Remove the temporary files of writes to `path` that were killed before they renamed them."""
    cutoff = min(time.time() - STALE_SECONDS, _LOADED)
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
        except OSError:  # gone already, or not ours to remove: the write goes on
            continue


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def render_text(summary: Summary) -> str:
    """The table printed at the end of a run: the verdict and why first, the series, then each finding
    under its state."""
    lines = _ending(summary)
    lines.append(f"leakdoctor: {summary.framework}, {summary.steps} steps, verdict {summary.verdict.upper()}")
    lines.append(f"  why: {_why(summary)}")
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
    line = _overhead_line(summary.overhead)
    return "\n".join(lines + ([line] if line else []))


def _overhead_line(overhead: dict[str, float]) -> str | None:
    """'overhead: 2.10% of the run's time (step() 0.40%, 1 investigation(s) 1.70%; a sample every 4
    step(s): ...)': the total first, then its parts. Summaries written before the total was kept give
    the share of step time alone."""
    stride, latency = overhead.get("sample_stride"), overhead.get("latency_steps")
    paced = f"a sample every {stride} step(s): a fast leak is found within ~{latency} steps" if latency else ""
    run, total = overhead.get("run_seconds"), overhead.get("total_seconds")
    if run and total is not None:
        thread = overhead.get("thread_cpu_seconds")
        parts = (f"step() {overhead.get('probe_seconds', 0.0) / run:.2%}, "
                 + (f"sampler thread {thread / run:.2%}, " if thread else "")
                 + f"{overhead.get('investigations', 0):g} investigation(s) {overhead.get('forensic_seconds', 0.0) / run:.2%}")
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


def _why(summary: Summary) -> str:
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
        return lines + [f"  why withdrawn: {f.reason}"]
    if f.location:
        lines.append(f"  where: {f.where}")
    lines.append(f"  evidence: {f.evidence_text}")
    if f.detected_rate is not None and f.rate_per_step and not 0.5 <= f.detected_rate / f.rate_per_step <= 2:
        lines.append(f"  rate: {format_value(f.detected_rate, f.unit)}/step when found at step {f.detected_step}, "
                     f"refit over the whole run since step {f.first_step}")
    lines.append(f"  fix: {f.recommendation_text}")
    if f.remedy:
        lines.append(f"  remedy: {_remedy_line(f.remedy, f.unit)}")
    lines += [f"  also: {_supporting_line(other)}" for other in f.supporting]
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


def _supporting_line(other: dict[str, Any]) -> str:
    """'rss_bytes 130.7 KiB/step since step 190 (leak); remedy clear_cache at step 300, effective': what
    another metric showed of the same cause at the same place."""
    text = (f"{other.get('metric')} {format_value(other.get('rate_per_step'), other.get('unit') or 'count')}/step "
            f"since step {other.get('first_step')} ({other.get('state')})")
    remedy = other.get("remedy")
    if remedy:
        text += f"; remedy {_remedy_line(RemedyOutcome(**known_fields(RemedyOutcome, remedy)), other.get('unit') or 'count')}"
    return text


def _ending(summary: Summary) -> list[str]:
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
