"""on_limit: what a doctor does when a leak that no remedy stopped is about to reach the memory limit.

It reads what the clinic found and what report.py projects, and acts downstream of both: it warns,
ends the run (`should_stop`, after the checkpoint), or calls the user's function; it never feeds
anything back into detection. Only a threat counts: a leak (not benign) with no effective remedy and
none still being verified, material over the horizon, still growing since it was found, and projected
to reach the limit of a metric it explains. A clean run has no such finding, so it is never stopped.

"warn" warns once the limit is projected within the horizon, again each time the steps left have
fallen to a quarter, and at the margin. The margin (`limit_margin`) is how close to the limit the run
may come: a number of steps, or a fraction of the steps run so far. The default, 0.1, gives up at most
a tenth of the run (it stops that much before it would have died) for a projection that reaches no
further ahead than a tenth of the steps seen so far, short enough that a steady leak does not outrun
it; and it scales with the run (a few steps early on, hundreds in a long run). However small the
margin, it covers twice the steps between two samples, since the doctor samples every few steps when
its steps are short.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from leakdoctor import report
from leakdoctor.detect import is_material
from leakdoctor.guard import Guard, warn
from leakdoctor.monitor import Monitor
from leakdoctor.settings import Settings
from leakdoctor.summary import Finding, format_value

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
        self._acted = False
        self._warned_left: int | None = None
        self._last_check: int | None = None

    def check(self, step: int, findings: list[Finding], monitor: Monitor, summary: Callable[[], Any]) -> None:
        """Called on every sample: look at the threats now; warn or act."""
        gap = step - self._last_check if self._last_check is not None else 1
        self._last_check = step
        if self._acted or not findings:
            return
        projected = report.projections(findings, monitor, step, verifying=False)
        threats = [p for p in projected if self._material(p, monitor)]
        margin = self.margin(step, gap)
        for threat in sorted(threats, key=lambda p: p.step):  # the nearest that still grows
            left = threat.step - step
            closer = left <= self.settings.horizon and (self._warned_left is None or left <= CLOSER * self._warned_left)
            if left > margin and not closer:
                return  # nothing due now, and the others are farther
            if not still_growing(monitor, threat):
                continue
            if left <= margin:
                self._acted = True
                self._act(threat, step, margin, summary)
                return
            self._warned_left = left
            advice = ("on_limit='stop' will end the run before then" if self.settings.on_limit == "stop" else
                      "on_limit='stop' would end the run with a checkpoint before then")
            warn(f"{self.describe(threat, step)}; {advice}")
            return

    def margin(self, step: int, gap: int) -> int:
        """The margin in steps at this step: limit_margin's steps, or its fraction of the steps so far;
        at least twice the steps between two checks."""
        margin = self.settings.limit_margin
        steps = margin if isinstance(margin, int) else math.ceil(margin * step)
        return max(steps, 2 * gap)

    def describe(self, projection: report.Projection, step: int) -> str:
        """'rss_bytes is projected to reach the memory limit (1.2 GiB, cgroup) at step 340, in 40 steps:
        python_objects leak of 3.0 MiB/step at train.py:12, not remedied'."""
        finding = projection.finding
        limit = self.limit_of(projection.metric) or {}
        source = f", {limit['source']}" if limit.get("source") else ""
        where = f" at {finding.location}" if finding.location else ""
        return (f"leakdoctor: {projection.metric} is projected to reach the memory limit "
                f"({format_value(projection.limit, 'bytes')}{source}) at step {projection.step}, in "
                f"{projection.step - step} steps: {finding.cause} leak of "
                f"{format_value(projection.rate, 'bytes')}/step{where}, not remedied")

    def _material(self, projection: report.Projection, monitor: Monitor) -> bool:
        spec = monitor.series[projection.metric].spec
        return is_material(spec.unit, projection.rate, projection.level, self.settings.horizon, projection.limit)

    def _act(self, threat: report.Projection, step: int, margin: int, summary: Callable[[], Any]) -> None:
        reason = f"{self.describe(threat, step)}, within the margin of {margin} steps"
        action = self.settings.on_limit
        if action == "warn":
            warn(f"{reason}; on_limit='stop' would end the run with a checkpoint now")
        elif action == "stop":
            saved = self.guard.call("checkpoint", self.settings.checkpoint) if self.settings.checkpoint else None
            checkpoint = None if "checkpoint" in self.guard.off else _checkpoint_name(saved, self.settings.checkpoint)
            self.stopped = {"step": step, "reason": reason.removeprefix("leakdoctor: "), "checkpoint": checkpoint}
            self.should_stop = True
            warn(f"{reason}: stopping the run at step {step}" + (f"; checkpoint: {checkpoint}" if checkpoint else ""))
        else:
            self.say(f"{reason.removeprefix('leakdoctor: ')}: calling on_limit")
            self.guard.call("on_limit", action, summary())


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
