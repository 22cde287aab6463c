"""on_limit: what a doctor does when a leak that no remedy stopped is about to reach the memory limit.

It reads what the clinic found and what reporting/_report.py projects, and acts downstream of both: it warns,
ends the run (`should_stop`, after the checkpoint), or calls the user's function; it never feeds
anything back into detection. Only a threat counts: a leak (not benign) with no effective remedy and
none still being verified, material over the horizon, still growing since it was found, and projected
to reach the limit of a metric it explains. A clean run has no such finding, so it is never stopped.

"warn" warns once the limit is projected within the horizon for a confirmed finding, again each time the steps left have
fallen to a quarter, and at the margin. A
finding is confirmed once the growth has been read long enough after its detection for the summary's own
judgement (_judging/stopped.py) to keep it; until then it is a suspicion, which the live "suspected" line
announces, and it is warned about early only where the limit would come before it could be confirmed (a
bounded cache filling is a suspicion that the summary withdraws: announcing it as a leak that reaches the
limit told the user two stories). The margin (`limit_margin`) is how close to the limit the run
may come: a number of steps, or a fraction of the steps run so far. The default, 0.1, gives up at most
a tenth of the run (it stops that much before it would have died) for a projection that reaches no
further ahead than a tenth of the steps seen so far, short enough that a steady leak does not outrun
it; and it scales with the run (a few steps early on, hundreds in a long run). However small the
margin, it covers twice the steps between two samples, since the doctor samples every few steps when
its steps are short.

In a distributed run one rank cannot leave the loop alone: the others would wait for it in their next
collective. There (SharedLimitWatch) a rank whose watch would stop asks instead, and the ranks agree on a
schedule every rank knows: the first agreement after `window` steps, and each sets the steps to the next
(what keeps the agreements within the doctor's overhead share, at most FARTHEST windows), so that the
ranks meet with no other communication. One collective says whether any rank asked, and if one did, every
rank stops at that same step, with one checkpoint. The margin covers the steps to the next agreement.
The summary's `stopped_by` says which rank asked, at which step, and why.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from typing import Any, Callable

from leakdoctor._base.findings import Finding
from leakdoctor._base.guard import Guard, warn
from leakdoctor._base.trend import is_material
from leakdoctor._base.units import format_value
from leakdoctor._judging.stopped import stopped
from leakdoctor._base.logs import Alert, retell
from leakdoctor._reading.monitor import Monitor
from leakdoctor.reporting import _report as report
from leakdoctor.settings import Settings

#: A warning is repeated when the steps left have fallen to this fraction of those last warned about.
CLOSER = 0.25


class LimitWatch:
    """Decides, on the doctor's samples, whether an unremedied leak is near the memory limit, and acts
    as `on_limit` asks: "warn", "stop", or a callable given the summary so far (once)."""

    def __init__(self, settings: Settings, guard: Guard, limit_of: Callable[[str], dict[str, Any] | None],
                 say: Callable[[str], None]) -> None:
        self.settings = settings
        self.guard = guard
        self.limit_of = limit_of
        self.say = say
        self.should_stop = False
        self.stopped: dict[str, Any] | None = None
        #: which rank asked to stop, at which step, and why (a distributed run's; None otherwise)
        self.stopped_by: dict[str, Any] | None = None
        #: steps between the decision and the stop (a distributed run's wait for the ranks to agree)
        self.latency = 0
        self._acted = False
        self._warned_left: int | None = None
        self._last_check: int | None = None
        #: a leak projected to reach the limit was seen at the last check (the ranks then agree often)
        self.threatened = False

    def check(self, step: int, findings: list[Finding], monitor: Monitor, summary: Callable[[], Any]) -> None:
        """Called on every sample: look at the threats now; warn or act."""
        gap = step - self._last_check if self._last_check is not None else 1
        self._last_check = step
        self.threatened = False
        if self._acted or not findings:
            return
        projected = report.projections(findings, monitor, step, verifying=False)
        threats = [p for p in projected if self._material(p, monitor)]
        self.threatened = bool(threats)
        margin = self.margin(step, gap)
        for threat in sorted(threats, key=lambda p: p.step):  # the nearest that still grows
            left = threat.step - step
            closer = left <= self.settings.horizon and (self._warned_left is None or left <= CLOSER * self._warned_left)
            if left > margin and not closer:
                return  # nothing due now, and the others are farther
            if not still_growing(monitor, threat):
                continue
            if left > margin and not self._confirmed(threat.finding, monitor, step, left, margin):
                continue  # a suspicion: its line said so; it is warned about once confirmed
            if left <= margin:
                self._acted = True
                self._act(threat, step, margin, summary)
                return
            self._warned_left = left
            advice = ("on_limit='stop' will end the run before then" if self.settings.on_limit == "stop" else
                      "on_limit='stop' would end the run with a checkpoint before then")
            warn(Alert(f"{self.describe(threat, step)}; {advice}", "limit", threat.finding, step=step, state="leak"))
            return

    def margin(self, step: int, gap: int) -> int:
        """The margin in steps at this step: limit_margin's steps, or its fraction of the steps so far;
        at least twice the steps between two checks; and the steps the stop may wait for (`latency`)."""
        margin = self.settings.limit_margin
        steps = margin if isinstance(margin, int) else math.ceil(margin * step)
        return max(steps, 2 * gap) + self.latency

    def describe(self, projection: report.Projection, step: int) -> str:
        """'rss_bytes is projected to reach the memory limit (1.2 GiB, cgroup) at step 340, in 40 steps:
        python_objects leak of 3.0 MiB/step at train.py:12, not remedied'; where the metric grows by more
        than the leak's own rate (other leaks in it, or the limit's figure counts more), that rate too."""
        finding = projection.finding
        limit = self.limit_of(projection.metric) or {}
        source = f", {limit['source']}" if limit.get("source") else ""
        where = f" at {finding.where}" if finding.location else ""
        own = finding.rate_per_step if finding.unit == "bytes" else projection.rate
        growing = "" if math.isclose(own, projection.rate, rel_tol=0.01) else \
            f" (growing {format_value(projection.rate, 'bytes')}/step)"
        return (f"leakdoctor: {projection.metric} is projected to reach the memory limit "
                f"({format_value(projection.limit, 'bytes')}{source}) at step {projection.step}, in "
                f"{projection.step - step} steps{growing}: {finding.cause} leak of "
                f"{format_value(own, 'bytes')}/step{where}, not remedied")

    def _confirmed(self, finding: Finding, monitor: Monitor, step: int, left: int, margin: int) -> bool:
        """May this finding be warned about before the margin? Once confirmed (`confirmed`) and read for
        at least 1/REACH of the steps its projection reaches ahead; or, while not yet, when the limit would
        come first: the windows it still needs, at `window` steps each, reach past the margin."""
        steps, _ = monitor.series[finding.metric].minima(0, finding.detected_step)
        missing = CONFIRM_WINDOWS * self.settings.verify_windows - len(steps)
        if missing > 0:
            return missing * self.settings.window >= left - margin
        if left > REACH * (step - finding.first_step):
            return False  # read too briefly to say where it goes: a cache may yet fill
        return confirmed(finding, monitor, self.settings)

    def _material(self, projection: report.Projection, monitor: Monitor) -> bool:
        spec = monitor.series[projection.metric].spec
        return is_material(spec.unit, projection.rate, projection.level, self.settings.horizon, projection.limit)

    def _act(self, threat: report.Projection, step: int, margin: int, summary: Callable[[], Any]) -> None:
        reason = Alert(f"{self.describe(threat, step)}, within the margin of {margin} steps", "limit", threat.finding,
                       step=step, state="leak")
        action = self.settings.on_limit
        if action == "warn":
            warn(retell(reason, f"{reason}; on_limit='stop' would end the run with a checkpoint now"))
        elif action == "stop":
            self._stop(reason, step)
        else:
            self.say(retell(reason, f"{reason.removeprefix('leakdoctor: ')}: calling on_limit"))
            self.guard.call("on_limit", action, summary())

    def _stop(self, reason: str, step: int) -> None:
        """End the run now: the checkpoint, `stopped`, `should_stop`."""
        checkpoint = self._checkpoint()
        self.stopped = {"step": step, "reason": reason.removeprefix("leakdoctor: "), "checkpoint": checkpoint}
        self.should_stop = True
        warn(retell(reason, f"{reason}: stopping the run at step {step}"
                    + (f"; checkpoint: {checkpoint}" if checkpoint else "")))

    def _checkpoint(self) -> str | None:
        """Call `checkpoint=` (guarded); what the summary records of it."""
        saved = self.guard.call("checkpoint", self.settings.checkpoint) if self.settings.checkpoint else None
        return None if "checkpoint" in self.guard.off else _checkpoint_name(saved, self.settings.checkpoint)


#: How the ranks agree: one collective that every rank enters at the same step, given this rank's few
#: integers; it returns their element-wise maximum over the ranks (an all_reduce MAX, or an all-gather).
Agree = Callable[[list[int]], list[int]]
#: A rank that asks sends ASKING - rank, the others 0: the maximum names the lowest rank that asked.
ASKING = 2**30
#: The agreements are at most this many times `every` (the window) apart, however dear: the stop waits for
#: the next one, and the margin before the limit grows by as much.
FARTHEST = 8
#: Agreements whose cost sets each rank's proposal.
RECENT_AGREEMENTS = 8


class SharedLimitWatch(LimitWatch):
    """on_limit="stop" for one rank of a distributed run. A rank whose watch would stop asks instead
    (`asked`); at the steps `due()` counts alike on every rank, `settle()` runs `agree`, and when any rank
    asked, every rank stops at that step: the checkpoint (on this rank if `checkpoint_here`: rank 0's for a
    loop, every rank's when saving is itself a collective, as Lightning's is), `stopped`, `stopped_by`,
    `should_stop`. The first agreement is `every` steps in; each sets the steps to the next: `every` when
    a leak of any rank is projected to reach its limit (a stop may come: it must not wait long), else the
    most any rank proposed: what keeps its agreements' cost within the doctor's `overhead` share of its
    steps' time (an agreement waits for the slowest rank, so a busy rank's is dear), between `every` and
    FARTHEST times it. Data flows one way: the agreement reads what the watch decided."""

    def __init__(self, settings: Settings, guard: Guard, limit_of: Callable[[str], dict[str, Any] | None],
                 say: Callable[[str], None], *, agree: Agree, every: int, rank: int, checkpoint_here: bool) -> None:
        super().__init__(settings, guard, limit_of, say)
        self.agree = agree
        self.shortest = every
        self.every = every  # the steps to the next agreement, as the ranks agreed
        self.rank = rank
        self.checkpoint_here = checkpoint_here
        self.latency = every - 1  # a rank that asks stops at the next agreement, at most every - 1 steps on
        self.asked: dict[str, Any] | None = None
        self.agreements = 0
        self.agree_seconds = 0.0  # the collectives' time, which the summary's overhead includes
        self._costs: deque[float] = deque(maxlen=RECENT_AGREEMENTS)
        self._calls = 0
        self._next = every

    def _stop(self, reason: str, step: int) -> None:
        self.asked = {"rank": self.rank, "step": step, "reason": reason.removeprefix("leakdoctor: ")}
        warn(retell(reason, f"{reason}: asking every rank to stop (the ranks agree again within {self.every} steps)"))

    def due(self) -> bool:
        """Count a step; True at the steps where the ranks agree (until they stopped)."""
        self._calls += 1
        return self._calls >= self._next and not self.should_stop

    def settle(self, step: int, step_seconds: float) -> None:
        """Agree with the other ranks; stop at this step if any of them (or this one) asked. `step_seconds`:
        the user's time per step, which this rank's proposal for the next agreement is weighed against."""
        start = time.perf_counter()
        asking = ASKING - self.rank if self.asked is not None else 0
        top, threatened, proposed = self.agree([asking, int(self.threatened), self.proposal(step_seconds)])
        cost = time.perf_counter() - start
        self.agree_seconds += cost
        self._costs.append(cost)
        self.agreements += 1
        every = self.shortest if threatened else proposed
        self.every, self.latency = every, every - 1
        self._next = self._calls + every
        if top:
            self._stop_together(step, ASKING - top)

    def proposal(self, step_seconds: float) -> int:
        """The steps to the next agreement this rank proposes: its agreements' typical cost over the share
        of a step's time the doctor may take, between `shortest` and FARTHEST times it."""
        budget = self.settings.sampling_budget * step_seconds
        if not self._costs or budget <= 0:
            return self.shortest
        wanted = math.ceil(statistics.median(self._costs) / budget)
        return max(self.shortest, min(wanted, FARTHEST * self.shortest))

    def _stop_together(self, step: int, by: int) -> None:
        asked = self.asked if self.asked is not None and by == self.rank else None
        self.stopped_by = asked or {"rank": by, "step": None, "reason": None}
        reason = asked["reason"] if asked else f"rank {by} asked every rank to stop before the memory limit"
        checkpoint = self._checkpoint() if self.checkpoint_here else None
        self.stopped = {"step": step, "reason": reason, "checkpoint": checkpoint}
        self._acted = self.should_stop = True
        warn(Alert(f"leakdoctor: {reason}: every rank stops at step {step}"
                   + (f"; checkpoint: {checkpoint}" if checkpoint else ""), "limit", step=step, state="leak"))


#: The windows (in verify_windows) read after detection that confirm a finding: those _judging/stopped.py needs
#: to tell a growth that goes on from one that stopped by itself.
CONFIRM_WINDOWS = 2
#: How far ahead of the growth it has read a warning may project: ten times the steps the growth lasted. A
#: bounded cache fills steadily for a few hundred steps (an lru_cache of 256 kB values), which projected
#: to the limit 95,000 steps on made a warning that the summary then withdrew; a leak still growing when it
#: has lasted a tenth of the way is warned about then (and one near the limit at once, as above).
REACH = 10


def confirmed(finding: Finding, monitor: Monitor, settings: Settings) -> bool:
    """Is a finding confirmed: read for CONFIRM_WINDOWS * verify_windows windows since its detection, and
    not a growth that stopped by itself (what the summary would withdraw)? A proven cause on resident memory
    stays confirmed (the heap it reuses can level off while the cause goes on), as the summary keeps it."""
    steps, _ = monitor.series[finding.metric].minima(0, finding.detected_step)
    if len(steps) < CONFIRM_WINDOWS * settings.verify_windows:
        return False
    if report.proven(finding) and finding.metric == report.RESIDENT:
        return True
    return not stopped(finding, monitor, settings)


def still_growing(monitor: Monitor, projection: report.Projection) -> bool:
    """Has the metric kept at least half the leak's pace since the leak was found? (Window minima, so a
    spike does not count; with fewer than three windows since, the investigation that just confirmed
    the growth stands.)"""
    steps, minima = monitor.series[projection.metric].minima(0, projection.finding.detected_step)
    if len(minima) < 3:
        return True
    return minima[-1] - minima[0] >= 0.5 * projection.rate * float(steps[-1] - steps[0])


def _checkpoint_name(saved: Any, checkpoint: Callable[[], Any] | None) -> str | None:
    """What the summary records of the checkpoint: the path the callable returned, else its name."""
    if checkpoint is None:
        return None
    if isinstance(saved, (str, bytes)) or hasattr(saved, "__fspath__"):
        return str(saved if not isinstance(saved, bytes) else saved.decode())
    return f"{getattr(checkpoint, '__qualname__', type(checkpoint).__name__)}()"
