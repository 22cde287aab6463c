"""One summary for a distributed run: rank 0's own summary, extended with the findings of every other
rank (one per cause and place, however many ranks found it), a `ranks` entry per rank, and, when
on_limit="stop" stopped every rank, which rank asked and why (`stopped_by`: only the rank that asked
knows its reason). Pure: the gathering itself belongs to the framework (torch.distributed in
integrations/_torch.py).

Every rank but rank 0 writes its own summary beside the summary path (`rank_path`: leaks.json ->
leaks.rank3.json): while the run goes (heartbeat, oom_watermark), so that a rank the kernel killed leaves
its post-mortem, and at its end, so that a rank that died of an exception (an out-of-memory error: its
`oom` entry) leaves the summary rank 0 never received. The merged summary names each rank's file
(`ranks[].file`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from leakdoctor._base.messages import msg
from leakdoctor.reporting.summary import Summary


def rank_path(path: str | os.PathLike[str], rank: int) -> Path:
    """Where rank `rank` (> 0) writes its own summary: beside the summary path, the rank before the
    suffix (leaks.json -> leaks.rank3.json; leaks -> leaks.rank3)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def options_on_rank(options: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """A doctor's options on a rank of a distributed run: `rank` defaults to this one, and a rank > 0 writes
    its own summary beside the summary path (rank_path), with no plot."""
    options = {**options}
    options.setdefault("rank", rank)
    if options["rank"] > 0:
        path = options.get("summary_path")
        options.update(summary_path=rank_path(path, options["rank"]) if path is not None else None, plot_path=None,
                       html_path=None)
    return options


def rank_entry(summary: Summary, file: str | None = None) -> dict[str, Any]:
    """What the merged summary keeps of one rank: its verdict, its findings and its series' ends and peaks,
    and `file`, the path it writes its own summary to (None without one). A rank that stopped because
    another asked is judged by its own findings, not by the stop."""
    by = summary.stopped_by
    if by and by.get("rank") != summary.rank:  # stopped because another rank asked: its own verdict stands
        summary = dataclasses.replace(summary, stopped=None)
    return {
        "rank": summary.rank,
        "steps": summary.steps,
        "verdict": summary.verdict,
        "findings": [f.to_dict() for f in summary.findings],
        "series": {name: {"end": s.end, "peak": s.peak, "trend": s.trend} for name, s in summary.series.items()},
        "overhead": summary.overhead.get("fraction_of_step_time", 0.0),
        "errors": list(summary.errors),
        "file": file,
    }


def merge(summaries: Sequence[Summary], files: Mapping[int, str | None] | None = None) -> Summary:
    """Rank 0's summary with every rank's findings and a `ranks` entry per rank (in rank order); `files`:
    {rank: the file that holds its own summary} (rank 0's: the merged one)."""
    if not summaries:
        raise ValueError("merge: no summaries")
    ordered = sorted(summaries, key=lambda s: s.rank)
    first = ordered[0]
    findings, notes = list(first.findings), list(first.notes)
    where = {f.key: f for f in findings}
    for other in ordered[1:]:
        for finding in other.findings:
            if finding.key in where:
                continue
            where[finding.key] = finding
            findings.append(finding)
            notes.append(msg("not_seen_on_rank", rank=other.rank, cause=finding.cause, metric=finding.metric,
                             first=first.rank))
    projections = [s.projected_limit_step for s in ordered if s.projected_limit_step is not None]
    stopped, by = first.stopped, asker(ordered)
    if stopped and by and by.get("reason"):
        stopped = {**stopped, "reason": by["reason"]}
        notes.append(msg("rank_asked_to_stop", rank=by["rank"], step=by["step"], reason=by["reason"]))
    return dataclasses.replace(
        first, findings=findings, notes=notes, ranks=[rank_entry(s, (files or {}).get(s.rank)) for s in ordered],
        stopped=stopped, stopped_by=by,
        projected_limit_step=min(projections) if projections else None,
        errors=[{**e, "part": f"rank {s.rank}: {e['part']}"} if s.rank != first.rank else e
                for s in ordered for e in s.errors],
    )


def asker(summaries: Sequence[Summary]) -> dict[str, Any] | None:
    """The `stopped_by` of a run all ranks stopped: from the lowest rank that asked itself (which alone
    knows the step it asked at and why), else what any rank knows."""
    asked = [s.stopped_by for s in summaries if s.stopped_by and s.stopped_by.get("rank") == s.rank]
    return (asked or [s.stopped_by for s in summaries if s.stopped_by] or [None])[0]
