"""A finding, a remedy's outcome and a series' summary: what the judging concludes and the reporting
writes (reporting/summary.py), on the ground floor so that every stage can make or read one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from leakdoctor._base.messages import Location, Record, legacy, location_text, parse_location, render
from leakdoctor._base.schema import CAUSES

__all__ = ["LOCAL", "RemedyOutcome", "Finding", "SeriesSummary", "known_fields", "proving"]


@dataclass
class RemedyOutcome:
    """What a remedy did and whether the growth stopped afterwards (None until verified)."""

    name: str
    applied_step: int
    effective: bool | None = None
    rate_after: float | None = None
    detail: Record | list | str = ""  # what it did: a catalogue record (or records); prose in older files
    error: str | None = None


#: Finding fields that stay in the process: what a remedy acts on, the remedy (serialized apart), what the
#: diagnosis reads.
LOCAL = frozenset({"subject", "remedy", "explains", "accounts"})


@dataclass
class Finding:
    """One diagnosed cause of growth. `reclaimed_by` names the cleanup that took the growth back (so the
    matching remedy can repeat it); `subject` is what a remedy acts on and is never serialized.
    `severity`, `state` and `reason` are set in the summary (None while the run goes on: the finding is
    suspected); `detected_rate` is the rate announced when it was found, before the whole-run refit;
    `supporting`, set in the summary too, what other metrics showed of the same cause at the same place."""

    cause: str
    metric: str
    first_step: int
    detected_step: int
    rate_per_step: float
    unit: str
    #: {"file", "line", "function", "holder"} (_base/messages.py), None where no place is known
    location: Location | None
    #: records of the message catalogue (_base/messages.py): what proved it, and what to do
    evidence: Record
    recommendation: Record
    rate_interval: tuple[float, float] | None = None
    benign: bool = False
    reclaimed_by: str | None = None
    remedy: RemedyOutcome | None = None
    explains: tuple[str, ...] = ()
    severity: str | None = None
    state: str | None = None
    reason: Record | None = None  # why it was withdrawn (a catalogue record; prose in a file of schema 1)
    detected_rate: float | None = None
    #: the same cause at the same place seen on other metrics (report.merged): each one's metric, rate,
    #: unit, steps, state, severity and remedy, as its own finding would have said
    supporting: list[dict[str, Any]] = field(default_factory=list)
    #: what proved it that no series of the run holds, as its investigation read it: {"name", "unit",
    #: "points": [[step, value], ...]} (the autograd nodes a census counted at the window's two ends)
    proof: list[dict[str, Any]] = field(default_factory=list)
    subject: Any = field(default=None, repr=False, compare=False)
    #: bytes of each explained metric's growth in the window that this finding's own evidence measured (the
    #: new items of a container, a traced allocation site); a metric it explains but did not measure (a kept
    #: graph's saved activations have no size a census reads) is not here. Never serialized: the diagnosis
    #: reads it to let another proven cause claim the rest of the same metric (_judging/diagnosis.py).
    accounts: dict[str, float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"unknown cause {self.cause!r}: expected one of {sorted(CAUSES)}")
        if not self.explains:
            self.explains = (self.metric,)
        # text (an old file, a caller that still writes prose) is kept as the catalogue's `text` record
        self.location = parse_location(self.location)
        self.evidence, self.recommendation = legacy(self.evidence), legacy(self.recommendation)
        self.reason = legacy(self.reason)
        if self.detected_rate is None:
            self.detected_rate = self.rate_per_step

    @property
    def final_state(self) -> str:
        """The state, or for a finding not yet judged (a live one, or one of an older file) what its
        fields say: benign, remedied (an effective remedy) or leak."""
        if self.state is not None:
            return self.state
        return "benign" if self.benign else "remedied" if self.remedy and self.remedy.effective else "leak"

    @property
    def where(self) -> str | None:
        """The location as a person reads it ('val_losses in train() (train.py:42)')."""
        return location_text(self.location)

    @property
    def evidence_text(self) -> str:
        return render(self.evidence)

    @property
    def recommendation_text(self) -> str:
        return render(self.recommendation)

    @property
    def counts(self) -> bool:
        """Does it make the verdict: a major leak, remedied or not (a minor one is listed only)?"""
        return self.final_state in ("leak", "remedied") and self.severity != "minor"

    @property
    def key(self) -> tuple[str, str, str | None]:
        """Identity across investigations: the same cause on the same metric at the same place."""
        return self.cause, self.metric, self.where

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in LOCAL}
        data["remedy"] = asdict(self.remedy) if self.remedy else None
        data["series"] = list(self.explains)  # the series that proved it (the plot's panels, the table's lines)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        known = {f.name for f in fields(cls)} - LOCAL
        remedy = data.get("remedy")
        fields_ = {k: v for k, v in data.items() if k in known}
        if fields_.get("rate_interval") is not None:
            fields_["rate_interval"] = tuple(fields_["rate_interval"])
        if isinstance(data.get("series"), list):
            fields_["explains"] = tuple(str(name) for name in data["series"])
        return cls(**fields_, remedy=RemedyOutcome(**known_fields(RemedyOutcome, remedy)) if remedy else None)


@dataclass
class SeriesSummary:
    """One metric over the run. `points` is a bounded, decimated history for plots. `trend`: growing,
    plateau (grew, then stopped) or flat; `slow`: a growth too slow to matter over the horizon (it grew
    steadily, so it is `growing`, never `flat`; its rate is `slope_per_step`)."""

    unit: str
    start: float
    end: float
    peak: float
    slope_per_step: float
    trend: str
    points: list[tuple[int, float]] = field(default_factory=list)
    slow: bool = False

    @property
    def trend_text(self) -> str:
        """The trend as the table says it: 'growing, too slow to matter' for a slow growth."""
        return f"{self.trend}, too slow to matter" if self.slow and self.trend == "growing" else self.trend

    @property
    def grows(self) -> bool:
        """A growth that matters over the horizon (what the plot and the step-time line speak of)."""
        return self.trend == "growing" and not self.slow


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The entries of `data` that are fields of the dataclass `cls` (a newer file may have more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def proving(f: Finding, series: dict[str, SeriesSummary]) -> list[str]:
    """The series that proved a finding, that the summary has: its metric, then what it explains (the hooks,
    the compiles, the live arrays, a container's length that grew with it)."""
    return [name for name in dict.fromkeys([f.metric, *f.explains]) if name in series]
