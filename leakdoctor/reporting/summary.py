"""The end-of-run report: findings, series, verdict; rendered as JSON (schema leakdoctor.summary/2, whose
names are _base/schema.py's; /1 is still read), as a text table, and (with the [plot] extra) as a PNG (_plot.py). Read back from a
file with Summary.load, which loading.py checks first. A Summary is made of the ground floor's Finding,
RemedyOutcome and SeriesSummary (leakdoctor/_base/findings.py), which this module also exports."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from leakdoctor._base.findings import Finding, RemedyOutcome, SeriesSummary, known_fields, proving
from leakdoctor._base.messages import Record, legacy, render
from leakdoctor._base.schema import OLD_SCHEMAS, SCHEMA
from leakdoctor._base.units import format_value
from leakdoctor.reporting import _html as html
from leakdoctor.reporting._files import now_iso, write_atomic
from leakdoctor.reporting.loading import read
from leakdoctor.reporting._plot import plot_summary
from leakdoctor.reporting._text import render_text, step_time_line

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
    #: records of the message catalogue (_base/messages.py): what no field says
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
            "notes": list(self.notes),  # records (_base/messages.py): `leakdoctor report` renders them
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

    def write_html(self, path: str | os.PathLike[str]) -> None:
        """Write the run as one self-contained HTML page (reporting/_html.py), atomically."""
        html.write(self, path)

    def _repr_html_(self) -> str:
        """In a notebook, a summary displays as its HTML report (its style scoped to the report)."""
        return html.fragment(self)


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
