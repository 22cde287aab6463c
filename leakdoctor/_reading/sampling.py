"""The per-step path: which steps are sampled, what a sample reads, and what the doctor's own time is.

A step that is not sampled costs a decrement and a comparison (LeakDoctor.step). A sample reads the
probes that are due and appends each reading to its series: O(1) work per series, no statistics (the
clinic runs them, and only for a series whose window closed on a new high). It also times the user's
steps since the last sample: their wall time, which the overhead fraction and the pacer divide by, and
the process's CPU time, a series of its own. The clocks read on the way are vDSO reads; the only system
calls of a common sample are the two counters it is for: resident memory's pread and the process's CPU
time (a system call costs 2-10 µs right after a step that ran for a while, more than the Python around
it).

The pacer sets the steps to the next sample from the mean wall time of the doctor's sampling work,
PACE_EVERY samples at a time: the clock of the own account and of a caller timing `doctor.step()`.
Investigations, remedies and self-pacing probes have budgets of their own and are left out. Once a
metric rises (Monitor.rising), windows are sampled at least twice each for HURRY_WINDOWS windows,
whatever the budget, so that a fast leak is confirmed at the pace of the statistics.

With the sampler thread (thread.py, `sampler="auto"` or `"thread"`), resident memory is also watched off
the training thread, window by window: a rise it sees wakes the next step and starts the hurry, so a
leak is confirmed at the pace of the statistics however wide the stride. Every series is still recorded
here, every probe at the same step.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from leakdoctor._base.guard import Guard
from leakdoctor._base.trend import is_material
from leakdoctor._reading.monitor import Monitor
from leakdoctor._reading.pacing import Pacer
from leakdoctor._reading.probing import Probes
from leakdoctor._reading.thread import THREAD_BUDGET, SamplerThread
from leakdoctor.settings import Settings

STEP_TIME = "step_seconds"
RESIDENT = "rss_bytes"
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

    def __init__(self, settings: Settings, probes: Probes, monitor: Monitor, guard: Guard) -> None:
        self.settings = settings
        self.probes = probes
        self.monitor = monitor
        self.guard = guard
        self.pacer = Pacer(budget=settings.sampling_budget)
        self.thread: SamplerThread | None = None  # watching resident memory off the training thread, if running
        self.thread_cpu_seconds = 0.0  # the CPU time of the sampler threads that ended (a fork's, a failed one)
        self._new_thread: Callable[[], SamplerThread] | None = None
        self.inline_why: str | None = None  # why the thread watches no windows (or none runs)
        self._ended_mode = "inline"  # the mode when the thread was stopped
        self._watermark: Callable[[], float] = lambda: math.inf  # resident bytes that raise the alarm
        self._rested_cost: float | None = None  # the CPU cost per tick of a thread that ended for want of work
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
        self._sample_end, self._cpu_mark = time.perf_counter(), time.process_time() - self.thread_seconds

    def start_thread(self, wake: Callable[[], None], step_of: Callable[[], int],
                     alarm: Callable[[int, float], Any], watermark: Callable[[], float]) -> None:
        """Watch resident memory on the sampler thread from now on (_reading/thread.py), when a probe can
        give it a reader: a rise it sees wakes the next step and hurries the samples."""
        probe = next((p for p in self.probes.threaded() if RESIDENT in getattr(p, "metrics", ())), None)
        if probe is None:
            return
        if self.settings.sampler == "auto" and _address_space_limited():
            self.inline_why = ("RLIMIT_AS limits the address space, and a thread maps some 72 MiB of it (its "
                               "stack and its malloc arena)")
            return
        settings, limit = self.settings, probe.spec(RESIDENT).limit

        def matters(rate: float, level: float) -> bool:
            return is_material("bytes", rate, level, settings.horizon, limit)

        def rose() -> None:  # on the thread: hurry from the step it saw, and sample at the next
            self.hurry_until = max(self.hurry_until, step_of() + HURRY_WINDOWS * settings.window)
            wake()

        def new_thread() -> SamplerThread:
            return SamplerThread(probe.thread_reader(), step_of, lambda: self.step_seconds, settings.window,
                                 settings.warmup, rose, alarm, watermark, matters)

        self._new_thread, self._watermark = new_thread, watermark
        self._restart_thread()

    def stop_thread(self) -> None:
        """Stop the sampler thread (at finish)."""
        if self.thread is not None:
            self.thread.stop()
            self.thread_cpu_seconds += self.thread.cpu_now()
            self._ended_mode = self.mode
            self.thread = None
        self._new_thread = None

    @property
    def thread_seconds(self) -> float:
        """The sampler threads' CPU time so far."""
        return self.thread_cpu_seconds + (self.thread.cpu_now() if self.thread is not None else 0.0)

    @property
    def mode(self) -> str:
        """Where resident memory's rise is watched: "thread" (the sampler thread, window by window) or
        "inline" (on the sampled steps only: no thread, or one whose budget cannot buy a reading a
        window, which watches the memory limit only)."""
        if self.thread is None:
            return self._ended_mode
        return "thread" if self.thread.watching else "inline"

    def sample(self, step: int, start: float, investigating: bool, every_step: bool = False) -> dict[str, list[int]]:
        """Read the due probes and record them (with the user's step times, except while an investigation
        runs every step); return {metric: pyramid levels that completed a window}. `every_step`: the next
        step is sampled too (an investigation or a triage is open)."""
        self._check_thread()
        readings = self.probes.read_due()
        if not investigating:
            readings[STEP_TIME], readings[STEP_CPU] = self.account_user_time(step, start)
        next_step = step + 1 if investigating or every_step else step + self.steps_to_next(step)
        completed = self.monitor.record(step, readings, self.probes.spec, next_step)
        if completed and self.monitor.rising(completed):
            self.hurry_until = step + HURRY_WINDOWS * self.settings.window
        return completed

    def _check_thread(self) -> None:
        """A thread that ended is reported (it failed) or replaced (a fork left it in the parent). One
        watches the windows only where its budget buys a reading a window (short steps, dear wake-ups:
        the watermark only), until the budget buys one and a half again."""
        thread = self.thread
        if thread is None:
            self._wake_rested()
            return
        if not thread.running:
            self._thread_ended(thread)
            return
        worth = True if self.settings.sampler == "thread" else thread.affordable
        if worth is not None and worth != thread.watching:
            thread.watch_windows(worth)
            self.inline_why = None if worth else (
                f"a reading off the training thread costs {thread.cost * 1e6:.0f} µs of CPU, so {THREAD_BUDGET:.1%} "
                f"of a core buys one every {thread.cost / THREAD_BUDGET * 1e3:.0f} ms, and a window is "
                f"{thread.window * self.step_seconds * 1e3:.1f} ms: the thread watches the memory limit only")

    def _wake_rested(self) -> None:
        """A thread that rested (it had nothing to watch) comes back when the budget buys one and a half
        readings a window at the cost it measured (as SamplerThread.affordable), or a memory limit to
        watch came back; it rests again by itself if that was a passing spike of the step time."""
        cost = self._rested_cost
        if cost is None or self._new_thread is None:
            return
        if self.settings.window * self.step_seconds * THREAD_BUDGET >= 1.5 * cost or self._watermark() < math.inf:
            self._rested_cost = None
            self._restart_thread()

    def _thread_ended(self, thread: SamplerThread) -> None:
        """A thread that failed is reported once; one left behind by a fork (this process is the child,
        and steps) is replaced by one of this process."""
        self.thread_cpu_seconds += thread.cpu_now()
        self.thread = None
        if thread.failed is not None:
            self.guard.disable("sampler thread", f"{thread.failed}; resident memory is watched on the sampled steps")
        elif thread.rested:  # it had nothing to watch (SamplerThread.rest_when_idle): back when it has
            self._ended_mode, self._rested_cost = "inline", thread.cost
        elif self._new_thread is not None:
            self._restart_thread()

    def _restart_thread(self) -> None:
        """A new thread, which measures its cost before it watches the windows (_check_thread decides). With
        sampler="auto", it ends by itself when it has nothing to watch (rest_when_idle)."""
        self.thread = self._new_thread()
        self.thread.rest_when_idle = self.settings.sampler == "auto"
        self.thread.start()

    def steps_to_next(self, step: int) -> int:
        """The steps to the next sample: the pacer's stride, at most half a window while hurrying."""
        if step < self.hurry_until:
            return min(self.pacer.every, max(1, self.settings.window // 2))
        return self.pacer.every

    def account_user_time(self, step: int, now: float) -> tuple[float, float]:
        """Add the user's time since the last sample to the total; return it per step, as wall time and as
        this process's CPU time (which other processes on a busy machine do not inflate). The doctor's own
        time since the last sample is taken off each: its wall time off the wall time, its CPU time and the
        sampler thread's off the CPU time (an investigation's wall time, on a busy machine, can exceed the
        steps' CPU time)."""
        steps = max(1, step - self.sampled_step)
        cpu_now = time.process_time() - self.thread_seconds  # the sampler thread's CPU is the doctor's
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


def _address_space_limited() -> bool:
    """Is this process's virtual size bounded (a soft RLIMIT_AS), so that a thread's reservations count?"""
    try:
        import resource
    except ImportError:  # not on POSIX
        return False
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
