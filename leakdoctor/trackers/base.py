"""The common protocol of the trackers, and the records they are given.

A tracker is opened at the first sample (the script's run may be opened after the doctor is made), then
given scalars after each sample, the findings that appeared or changed state, and at the end the final
summary (and the plot's path, when one was written); then closed. It writes what it is given, nothing
else: the feed (feed.py) decides what is sent and when, and guards every call.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from leakdoctor._base.messages import location_text

if TYPE_CHECKING:
    from leakdoctor.reporting.summary import Finding, Summary

__all__ = ["Tracker", "finding_record", "where", "findings_markdown", "PREFIX", "COLUMNS"]

#: Where the doctor's scalars go in every tracker: `leakdoctor/rss_bytes`, `leakdoctor/findings/leak`.
PREFIX = "leakdoctor/"
#: The columns of a findings table (W&B's, TensorBoard's markdown), in the order shown.
COLUMNS = ("cause", "state", "severity", "where", "metric", "rate_per_step", "unit", "detected_step", "remedy")


class Tracker:
    """One experiment tracker. Subclasses set `name` and `extra` (the pip extra that installs its library)
    and override the methods below; each may raise (the feed reports it once and switches the tracker off)."""

    name: ClassVar[str] = "tracker"
    extra: ClassVar[str] = ""

    def open(self) -> None:
        """Find or start the run (import the library here, never at module level)."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """The latest value of each series and count, keyed without the prefix (`rss_bytes`)."""

    def findings(self, step: int, changed: Sequence[Mapping[str, Any]]) -> None:
        """The findings that appeared or changed state at `step` (finding_record's)."""

    def verdict(self, summary: "Summary", plot: Path | None) -> None:
        """The end: the final summary (verdict, findings), and the plot's path when one was written."""

    def close(self) -> None:
        """Flush, and end what this tracker started (never the script's own writer or run)."""


def finding_record(finding: "Finding") -> dict[str, Any]:
    """A finding as a tracker shows it: a flat record of its fields (no prose to parse)."""
    remedy = finding.remedy
    return {"cause": finding.cause, "state": finding.final_state, "severity": finding.severity or "",
            "where": where(finding.location), "metric": finding.metric, "rate_per_step": float(finding.rate_per_step),
            "unit": finding.unit, "detected_step": int(finding.detected_step),
            "remedy": f"{remedy.name} ({_VERIFIED[remedy.effective]})" if remedy else ""}


#: A remedy's outcome by `effective`: None while it is being verified.
_VERIFIED = {True: "effective", False: "not effective", None: "being verified"}


def where(location: Any) -> str:
    """A finding's place as one string, as the summary's text says it."""
    return location_text(location) or ""


def findings_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """The records as a markdown table (TensorBoard's text plugin renders it)."""
    if not records:
        return "no findings"
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    rows += ["| " + " | ".join(_cell(r.get(c, "")) for c in COLUMNS) + " |" for r in records]
    return "\n".join(rows)


def _cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")
