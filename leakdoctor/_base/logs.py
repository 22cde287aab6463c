"""What the doctor tells the user, also through Python logging: `logging.getLogger("leakdoctor")`, so that
its live alerts and its final verdict reach the handlers a training stack already has (Lightning's, a
cluster's log shipping), at levels a handler can filter on, with the finding's fields on each record.

The doctor tells the user things through three channels, each one place in the code, and each logs here:
the live lines it prints (`LeakDoctor._say`: a growth suspected, a remedy applied and judged), the
LeakDoctorWarnings (`lifecycle.guard.warn`: a leak projected to reach the memory limit, a stop, a part of
the doctor that failed), and the summary at the end (`LeakDoctor._emit`: each finding, then the verdict).
What is logged is an `Alert`: the text as printed or warned, which carries its event and finding; a plain
string (a warning the pytest plugin passes on again) is not logged twice.

Levels: a suspicion, a remedy applied or that worked, a clean or remedied verdict: INFO; a remedy that did
not work, a leak (projected to the limit, a stop, a finding whose final state is leak, the verdict leak), an
unwatched verdict: WARNING; an error inside the doctor (a part switched off): ERROR.

Fields of each record (`record.<name>`, None where they do not apply): `event` (EVENTS), `cause`,
`metric`, `severity`, `state` ("suspected" while the run goes; the final state in the verdict's records),
`step`, `location`, `rank`; `remedy` for a remedy's events; `part` and `error` for an error; `verdict`
and `steps` for the verdict. The library adds a NullHandler only (the standard for libraries), so that
nothing is printed twice where no logging is configured: the doctor prints its own lines on stderr.

Imports nothing of leakdoctor (the guard, at the bottom of the house, logs through it).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterable, Iterator

__all__ = ["LOGGER", "EVENTS", "Alert", "alert", "retell", "verdict", "quiet"]

LOGGER = logging.getLogger("leakdoctor")
LOGGER.addHandler(logging.NullHandler())

#: Each event and the level of its record (a finding's record in the verdict: WARNING for a leak).
EVENTS: dict[str, int] = {
    "suspected": logging.INFO,        # a growth suspected, with its cause and place (live)
    "remedy_applied": logging.INFO,   # a remedy applied to a finding (live)
    "remedy_worked": logging.INFO,    # the growth stopped after the remedy (live)
    "remedy_failed": logging.WARNING,  # it did not (live)
    "limit": logging.WARNING,         # a leak projected to reach the memory limit; a stop; on_limit called
    "error": logging.ERROR,           # a part of the doctor failed and was switched off (or will try again)
    "finding": logging.INFO,          # a finding of the final summary (WARNING when its state is leak)
    "verdict": logging.INFO,          # the final verdict (WARNING for leak and unwatched)
}
#: The fields every record carries (None where they do not apply), so that a format string may name them.
FIELDS = ("event", "cause", "metric", "severity", "state", "step", "location", "rank", "remedy", "part", "error",
          "verdict", "steps")


class Alert(str):
    """A message the doctor prints or warns (a str, as its channels expect), which also carries what a log
    record needs: its `event` (a key of EVENTS), the `finding` it is about, and other `fields` (step,
    state, remedy, part, error)."""

    event: str
    finding: Any
    fields: dict[str, Any]

    def __new__(cls, text: str, event: str, finding: Any = None, **fields: Any) -> "Alert":
        alert_ = super().__new__(cls, text)
        alert_.event, alert_.finding, alert_.fields = event, finding, fields
        return alert_


def retell(message: str, text: str) -> str:
    """`text` (a message said again in other words: a Keras callback's label and clock) carrying the
    alert of `message` when it is one."""
    if isinstance(message, Alert):
        return Alert(text, message.event, message.finding, **message.fields)
    return text


def alert(message: str, **fields: Any) -> None:
    """Log `message` if it is an Alert, at its event's level, with its finding's fields and `fields`
    (rank, step, ...; the alert's own win). A plain string is not logged. Never raises."""
    if not isinstance(message, Alert):
        return
    try:
        finding = message.finding
        values = {**_of(finding), "state": "suspected" if finding is not None else None, **fields, **message.fields}
        _log(EVENTS.get(message.event, logging.INFO), str(message), event=message.event, **values)
    except Exception:  # noqa: BLE001 - logging must never hurt the run
        pass


def verdict(summary: Any) -> None:
    """Log the final summary: a record for each finding (WARNING for one whose final state is leak), then
    the verdict (WARNING for leak and unwatched). Never raises."""
    try:
        findings: Iterable[Any] = summary.findings
        for finding in findings:
            state = finding.final_state
            _log(logging.WARNING if state == "leak" and finding.counts else logging.INFO,
                 f"leakdoctor: {state} {finding.cause} on {finding.metric}"
                 + (f" at {finding.location}" if finding.location else ""),
                 **{**_of(finding), "event": "finding", "state": state, "rank": summary.rank})
        level = logging.WARNING if summary.verdict in ("leak", "unwatched") else logging.INFO
        _log(level, f"leakdoctor: verdict {summary.verdict} after {summary.steps} steps "
                    f"({len(summary.findings)} finding(s))",
             event="verdict", verdict=summary.verdict, steps=summary.steps, rank=summary.rank)
    except Exception:  # noqa: BLE001 - logging must never hurt the run
        pass


def _of(finding: Any) -> dict[str, Any]:
    """The fields a record takes from a finding (none without one)."""
    if finding is None:
        return {}
    return {"cause": finding.cause, "metric": finding.metric, "severity": finding.severity,
            "location": finding.location, "step": finding.detected_step}


#: How many `quiet()` blocks are open: nothing is logged while one is.
_quiet = 0


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Log nothing inside: for a caller that says itself what the doctor found (the pytest plugin's leak
    check, whose failure carries the summary and whose pass is silent)."""
    global _quiet
    _quiet += 1
    try:
        yield
    finally:
        _quiet -= 1


def _log(level: int, text: str, **values: Any) -> None:
    if not _quiet and LOGGER.isEnabledFor(level):
        LOGGER.log(level, "%s", text, extra={name: values.get(name) for name in FIELDS})
