"""The per-step path: which steps are sampled, what a sample reads, and what the doctor's own time is.

A step that is not sampled costs a countdown (LeakDoctor.step). A sample reads the probes that are due
and appends each reading to its series: O(1) work per series, no statistics (the clinic runs them, and
only for a series whose window closed on a new high). It also times the user's steps since the last
sample: their wall time, which the overhead fraction and the pacer divide by, and the process's CPU
time, a series of its own. The clocks read on the way are vDSO reads; the only system calls of a
common sample are the two counters it is for: resident memory's pread and the process's CPU time
(a system call costs 2-10 µs right after a step that ran for a while, more than the Python around it).

The pacer sets the steps to the next sample from the mean wall time of the doctor's sampling work,
PACE_EVERY samples at a time: the clock of the own account and of a caller timing `doctor.step()`.
Investigations, remedies and self-pacing probes have budgets of their own and are left out. Once a
metric rises (Monitor.rising), windows are sampled at least twice each for HURRY_WINDOWS windows,
whatever the budget, so that a fast leak is confirmed at the pace of the statistics.
"""

from __future__ import annotations

import time

from leakdoctor.reading.monitor import Monitor
from leakdoctor.reading.pacing import Pacer
from leakdoctor.reading.probing import Probes
from leakdoctor.settings import Settings

STEP_TIME = "step_seconds"
STEP_CPU = "step_cpu_seconds"
#: Samples whose mean cost the pacer gets at once: pacing each sample would cost a good part of one, and
#: a batch this long usually holds a window's close, so no batch is an outlier for it.
PACE_EVERY = 8
#: Windows sampled at least twice each after a metric's window minima rose RISING times in a row, so that
#: a leak is confirmed (SCALES[0] windows) at the latency of the statistics, not of the budget.
HURRY_WINDOWS = 8


class Sampler:
    """Takes a sample, says when the next is due, and keeps the time accounts: the user's (wall, and a
    moving average per step) and the doctor's own (its sampling time, which the summary reports)."""

    def __init__(self, settings: Settings, probes: Probes, monitor: Monitor) -> None:
        self.settings = settings
        self.probes = probes
        self.monitor = monitor
        self.pacer = Pacer(budget=settings.overhead)
        self.hurry_until = 0  # sampling at least twice a window until this step (a metric is rising)
        self.step_seconds = 0.0  # the user's wall time per step, a moving average
        self.user_seconds = 0.0  # the user's wall time over all steps so far
        self.own_seconds = 0.0  # the doctor's time in step(), investigations and remedies left out
        self.sampled_step = 0
        self._busy = self._busy_cpu = 0.0  # the doctor's wall and CPU time since the last sample
        self._costs, self._costed, self._paced_step = 0.0, 0, 0  # samples' cost not yet handed to the pacer
        self.restart()

    def restart(self) -> None:
        """Start the user's clock now (a context manager entered, after the doctor was built)."""
        self._sample_end, self._cpu_mark = time.perf_counter(), time.process_time()

    def sample(self, step: int, start: float, investigating: bool) -> dict[str, list[int]]:
        """Read the due probes and record them (with the user's step times, except while an investigation
        runs every step); return {metric: pyramid levels that completed a window}."""
        readings = self.probes.read_due()
        if not investigating:
            readings[STEP_TIME], readings[STEP_CPU] = self.account_user_time(step, start)
        next_step = step + 1 if investigating else step + self.steps_to_next(step)
        completed = self.monitor.record(step, readings, self.probes.spec, next_step)
        if completed and self.monitor.rising(completed):
            self.hurry_until = step + HURRY_WINDOWS * self.settings.window
        return completed

    def steps_to_next(self, step: int) -> int:
        """The steps to the next sample: the pacer's stride, at most half a window while hurrying."""
        if step < self.hurry_until:
            return min(self.pacer.every, max(1, self.settings.window // 2))
        return self.pacer.every

    def account_user_time(self, step: int, now: float) -> tuple[float, float]:
        """Add the user's time since the last sample to the total; return it per step, as wall time and as
        this process's CPU time (which other processes on a busy machine do not inflate). The doctor's own
        time since the last sample is taken off each: its wall time off the wall time, its CPU time off the
        CPU time (an investigation's wall time, on a busy machine, can exceed the steps' CPU time)."""
        steps = max(1, step - self.sampled_step)
        cpu_now = time.process_time()
        user = max(0.0, now - self._sample_end - self._busy)
        cpu = max(0.0, cpu_now - self._cpu_mark - self._busy_cpu)
        self.user_seconds += user
        self.sampled_step, self._sample_end, self._cpu_mark = step, now, cpu_now
        self._busy = self._busy_cpu = 0.0
        wall = user / steps
        self.step_seconds = wall if not self.step_seconds else 0.9 * self.step_seconds + 0.1 * wall
        return wall, cpu / steps

    def charge(self, step: int, wall: float, own: float, cpu: float, pace: float | None, sampled: bool) -> None:
        """Book one step() call that did work: `wall` its whole time, `own` that less investigations and
        remedies (the own account), `cpu` the doctor's CPU time in it (taken off the steps' CPU), `pace`
        the cost the pacer pays for (None: a call on a budget of its own, an investigation's or a
        hurry's). The pacer gets the mean of every PACE_EVERY samples; the calls between samples that had
        work to do count with the next sample."""
        self.own_seconds += own
        self._busy += wall
        self._busy_cpu += cpu
        if pace is None:
            return
        self._costs += pace
        self._costed += sampled
        if self._costed == PACE_EVERY:
            steps, self._paced_step = step - self._paced_step, step
            self.pacer.update(self._costs / PACE_EVERY, self.step_seconds, steps / PACE_EVERY)
            self._costs, self._costed = 0.0, 0
