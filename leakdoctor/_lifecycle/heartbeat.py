"""A summary that survives SIGKILL: the summary written while the run goes, not only at its end.

The out-of-memory killer (a cgroup's or the machine's; Kubernetes' `OOMKilled`) ends a process with
SIGKILL, which no handler sees, so the summary written at the end never is. While a run goes, the
summary is therefore written to `summary_path` (atomically, marked `"complete": false` with its
`written_at`): as soon as a finding is first made or changes state (a remedy applied, judged, undone),
and at least every `heartbeat` seconds; and once the figure the memory limit is compared with (resident
memory; a cgroup's charge under a cgroup limit: integrations/_limits.py) passes `oom_watermark` of the limit, at once, as the post-mortem (`"oom": {"imminent": true, ...}`: what grew, the sites seen, the
findings so far), which every later write keeps. `finish()` writes the final one (`"complete": true`).

Cheap on purpose: it is asked only on the steps that do work anyway (a sample), with the clock the step
already read; the findings are compared only while the clinic works on them or their number changed;
a write (a summary built, a file renamed into place) happens at most once a heartbeat besides the rare
findings' changes and the one post-mortem, and the timed writes take at most WRITE_SHARE of the run's time
(a heartbeat shorter than 50 times a write is stretched). A write that fails (a disk full or read-only for a moment) is
reported once through the guard (part "heartbeat"), and tried again with a backoff (FIRST_BACKOFF seconds,
doubled after each failure up to the heartbeat, or MAX_BACKOFF without one); the run goes on.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from leakdoctor._base.messages import msg
from leakdoctor._lifecycle import oom
from leakdoctor.reporting.summary import Summary

if TYPE_CHECKING:
    from leakdoctor._base.guard import Guard
    from leakdoctor.integrations._limits import Limit
    from leakdoctor._judging.clinic import Clinic
    from leakdoctor._reading.monitor import Monitor
    from leakdoctor.settings import Settings

#: The process's resident memory, which the sampler thread watches.
RESIDENT = "rss_bytes"
#: The guard's name for the writes made while the run goes.
PART = "heartbeat"
#: Seconds before a failed write is tried again; doubled after each failure in a row, at most the
#: heartbeat (MAX_BACKOFF without one).
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0
#: The share of the run's time the timed writes may take: a write (a summary built, a file renamed into
#: place) costs milliseconds, so a heartbeat shorter than 1/WRITE_SHARE writes is stretched to that.
WRITE_SHARE = 0.02


class Heartbeat:
    """Writes the summary of a run still going to `summary_path`: when a finding changes, every
    `heartbeat` seconds, and at once when the limit's figure (`limit.figure`: resident memory, or a cgroup's
    charge) passes `oom_watermark` of `limit`. Inert
    without a summary path (or with both options None). `build` gives the summary so far (a callable
    that does not hold the doctor: the engine's, _engine.py); `clock` is the clock the step path reads."""

    def __init__(self, settings: Settings, limit: Limit, monitor: Monitor, clinic: Clinic, guard: Guard,
                 build: Callable[[], Summary], clock: Callable[[], float] = time.perf_counter) -> None:
        self.path = settings.summary_path
        self.interval = settings.heartbeat if self.path is not None else None
        self.limit = limit
        self.monitor, self.clinic, self.guard, self.build, self._clock = monitor, clinic, guard, build, clock
        #: the clock reading at which the next timed write is due (inf: none)
        self.due = clock() + self.interval if self.interval is not None else math.inf
        #: the series the watermark reads: the figure the limit is compared with
        self.figure = limit.figure
        #: bytes of that figure above which the post-mortem is written (inf: never, or written already)
        self.watermark = (settings.oom_watermark * limit.bytes
                          if self.path is not None and settings.oom_watermark is not None else math.inf)
        self.fraction = settings.oom_watermark
        self.enabled = self.interval is not None or self.watermark < math.inf
        self.imminent: dict[str, Any] | None = None  # the post-mortem's `oom` entry, once written
        self.writes = 0
        self.seconds = 0.0  # time spent building and writing, which the doctor keeps out of its pacing
        self._pid = os.getpid()
        self._count = 0  # findings at the last look
        self._busy = False  # the clinic was working (investigating, treating) at the last look
        self._signature: tuple[Any, ...] = ()
        self._failures = 0  # writes failed in a row
        self._retry_at = -math.inf  # no write before this clock reading (backing off after a failure)
        self._pending = False  # a write is owed: it failed, or came during the backoff

    @property
    def active(self) -> bool:
        """Can anything be written while the run goes?"""
        return self.enabled and PART not in self.guard.off

    def check(self, now: float, step: int) -> None:
        """On a step that did work (a sample, a remedy), after it: write the post-mortem if resident memory
        passed the watermark in this step's sample, else the summary if a finding changed or the
        heartbeat is due. `now`: the step path's clock reading."""
        series = self.monitor.series
        figure = series.get(self.figure) or series.get(RESIDENT)  # resident memory, if the charge was not read
        if figure is not None and figure.end is not None and figure.end > self.watermark:
            self.passed(figure.end_step, figure.end)
        elif self.interval is not None and (now >= self.due or self._changed()):
            self.write()
        elif self._pending and now >= self._retry_at:
            self.write()

    @property
    def resident_watermark(self) -> float:
        """The watermark in resident bytes, for the sampler thread, which reads resident memory only: inf
        when the limit is compared with another figure (a cgroup's charge), which the samples read."""
        return self.watermark if self.figure == RESIDENT else math.inf

    def passed(self, step: int, used: float) -> None:
        """The limit's figure read `used` at `step` (the series' last reading, or the sampler thread's):
        past the watermark, write the post-mortem, once (the file keeps it from then on)."""
        if used > self.watermark:
            self.watermark = math.inf
            self._post_mortem(step, used)

    def _changed(self) -> bool:
        """Did a finding appear or change state since the last look? Compared in full only while the
        clinic works on them (an investigation concluding, a remedy judged) or their number changed."""
        findings = self.clinic.findings
        busy = not self.clinic.idle
        if not busy and not self._busy and len(findings) == self._count:
            return False
        self._busy, self._count = busy, len(findings)
        signature = tuple((f.key, f.benign, f.remedy.name if f.remedy else None,
                           f.remedy.effective if f.remedy else None, bool(f.remedy and f.remedy.error))
                          for f in findings)
        changed, self._signature = signature != self._signature, signature
        return changed

    def _post_mortem(self, step: int, used: float) -> None:
        """Memory is about to run out: note it, and write the summary with its `oom` entry now."""
        clinic, limit = self.clinic, self.limit
        investigating = list(clinic.investigation.suspects) if clinic.investigation is not None else []
        self.imminent = oom.imminent(step, used, limit, clinic.sites, self.monitor, investigating)
        what = msg("resident_memory") if self.figure == RESIDENT else msg("limit_figure", figure=self.figure)
        clinic.notes.append(msg("at_step", step=step, note=msg(
            "watermark_passed", what=what, used=used, share=used / limit.bytes, limit=limit.bytes,
            source=limit.source, watermark=self.fraction)))
        self.write()

    def write(self) -> bool:
        """Write the summary so far (with the post-mortem's `oom` entry, if one was written), marked
        incomplete; the next timed write is due a heartbeat later. False if nothing was written."""
        if not self.active or os.getpid() != self._pid:  # a forked child's copy: the file is the parent's
            return False
        start = self._clock()
        if start < self._retry_at:  # backing off after a failed write: written once the backoff ends
            self._pending = True
            return False
        written = self.guard.call(PART, self._attempt, default=False)
        end = self._clock()
        self.seconds += end - start
        if self.interval is not None:  # at most WRITE_SHARE of the time, however short the heartbeat
            self.due = end + max(self.interval, (end - start) / WRITE_SHARE)
        return bool(written)

    def _attempt(self) -> bool:
        """One write; an OSError (a full or read-only disk, a folder gone) is reported once and the write
        is owed, tried again after the backoff."""
        try:
            written = self._write()
        except OSError as err:
            self._failures += 1
            longest = self.interval if self.interval is not None else MAX_BACKOFF
            self._retry_at = self._clock() + min(max(longest, FIRST_BACKOFF),
                                                 FIRST_BACKOFF * 2 ** min(self._failures - 1, 30))
            self._pending = True
            self.guard.failed_once(PART, f"cannot write {self.path}: {type(err).__name__}: {err}",
                                   "tried again with a backoff")
            return False
        self._failures, self._pending = 0, False
        return written

    def _write(self) -> bool:
        summary = self.build()
        summary = dataclasses.replace(summary, complete=False, oom=summary.oom or self.imminent)
        summary.write(self.path)  # an OSError: reported once, tried again after the backoff (_attempt)
        self.writes += 1
        return True
