"""The end of a run: conclude what is pending, build the final summary, let the framework finish it, then
publish, write, plot and print it (once; later calls return the same summary).

The framework part (framework.py) finishes a rank's summary (`complete`: the torch doctor gathers every
rank's into rank 0's) and says whether this doctor emits it (`emits`); it is told how the run ended
(`Ending`). A SIGTERM that comes meanwhile takes effect once the summary is written
(termination.finishing).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from leakdoctor._engine import Engine
from leakdoctor.framework import Ending
from leakdoctor._judging import last_look
from leakdoctor._base import logs
from leakdoctor._base.guard import Guard
from leakdoctor._base.messages import msg
from leakdoctor._lifecycle import oom, stopping, termination
from leakdoctor.reporting import _exporter as exporter
from leakdoctor.reporting.summary import Summary

__all__ = ["finish", "write_summary"]


def finish(engine: Engine, exception: BaseException | None = None) -> Summary:
    """End the run (from any thread; safe to call more than once)."""
    with engine.lock, termination.finishing():
        return _end(engine, exception)


def _end(engine: Engine, exception: BaseException | None) -> Summary:
    if engine.result is not None:
        return engine.result
    engine.registration.cancel()
    engine.reserve.release()  # room for the summary, where the run's last allocation may have failed
    _note_ending(engine, exception)
    _conclude(engine)
    ending = _ending(engine, exception)
    engine.result = summary = _final_summary(engine, exception, ending)
    if engine.publisher is not None:  # the final values: pushed if asked, served for the linger
        engine.guard.call("prometheus", engine.publish, summary)
        exporter.conclude(engine.publisher, engine.settings, engine.guard)
        summary.errors = with_errors(summary, engine.guard).errors  # a failed push: in the summary written next
    if engine.trackers is not None:
        engine.guard.call("trackers", engine.publish, summary, engine.trackers)
        summary.errors = with_errors(summary, engine.guard).errors
    if engine.part.emits(summary, ending):
        _emit(engine, summary)
    if engine.trackers is not None:  # once the plot is written; a failure now is a warning and in `summary`
        engine.guard.call("trackers", engine.trackers.conclude, summary, _plot_written(engine))
        summary.errors = with_errors(summary, engine.guard).errors
    termination.unregister(engine)  # only now: a SIGTERM while finishing still finds it
    return summary


def _note_ending(engine: Engine, exception: BaseException | None) -> None:
    notes = engine.clinic.notes
    if engine.unattended == "collected":
        notes.append(msg("collected", step=engine.steps))
    if exception is not None:
        notes.append(msg("ended", error=type(exception).__name__, step=engine.steps))


def _conclude(engine: Engine) -> None:
    """Stop watching: the user's time so far, the sampler thread, the clinic's pending work, the last
    looks (_judging/last_look.py), the probes."""
    engine.sampler.account_user_time(engine.steps, time.perf_counter())
    engine.stop_counting()
    engine.sampler.stop_thread()
    clinic, guard = engine.clinic, engine.guard
    clinic.timed(guard.call, "finish", clinic.conclude_pending, engine.steps)  # in the overhead line
    clinic.timed(guard.call, "last look", last_look.conclude, clinic, engine.monitor, engine.settings,
                 engine.last_looks, engine.steps)
    engine.probes.close()


def _ending(engine: Engine, exception: BaseException | None) -> Ending:
    watch = engine.limit_watch
    together = isinstance(watch, stopping.SharedLimitWatch) and watch.should_stop
    return Ending(exception, engine.unattended, together, engine.steps, engine.settings, engine.guard,
                  lambda summary: write_summary(engine, summary))


def _final_summary(engine: Engine, exception: BaseException | None, ending: Ending) -> Summary:
    """The summary, its post-mortem (an out-of-memory error), as the framework completes it, with every
    error so far."""
    guard = engine.guard
    summary = guard.call("summary", engine.build_summary) or engine.bare_summary()
    summary = guard.call("post-mortem", oom.post_mortem, summary, exception, engine.steps, engine.clinic.sites,
                         engine.monitor, engine.snapshot) or summary
    summary = guard.call("complete summary", engine.part.complete, summary, ending) or summary
    return with_errors(summary, guard)  # a failed gathering of the ranks' summaries too


def with_errors(summary: Summary, guard: Guard) -> Summary:
    """`summary` with this doctor's errors that came after it was built (the post-mortem, the gathering of
    the ranks' summaries, the push), added after those it holds (a merged summary's, of every rank)."""
    late = [e for e in guard.errors if e not in summary.errors]
    return dataclasses.replace(summary, errors=[*summary.errors, *late]) if late else summary


def write_summary(engine: Engine, summary: Summary | None = None) -> bool:
    """Write `summary` (default: the run so far) to `summary_path` now, atomically; True if it was written.
    A path that fails is reported once and not tried again: the final summary then goes to stderr."""
    path = engine.settings.summary_path
    if path is None or "summary_path" in engine.guard.off:
        return False
    try:
        (summary or engine.summary_now()).write(path)
        return True
    except OSError as err:
        engine.guard.disable("summary_path", f"cannot write {path}: {err}; the final summary goes to stderr")
        return False


def _emit(engine: Engine, summary: Summary) -> None:
    """Write the JSON (stderr if the path fails), the plot, the HTML page, and print the table on rank 0."""
    settings = engine.settings
    if settings.summary_path is not None and not write_summary(engine, summary):
        print(summary.to_json(), file=sys.stderr)
    if settings.plot_path is not None:
        engine.guard.call("plot", summary.plot, settings.plot_path)
    if settings.html_path is not None:
        engine.guard.call("html", summary.write_html, settings.html_path)
    if settings.verbose and settings.rank == 0:
        print(summary.text(), file=sys.stderr)
    if settings.rank == 0:
        logs.verdict(summary)  # also to logging.getLogger("leakdoctor"), whatever `verbose` says


def _plot_written(engine: Engine) -> Path | None:
    """The plot's path once `_emit` wrote it (None without plot_path, or when plotting failed)."""
    path = engine.settings.plot_path
    return path if path is not None and "plot" not in engine.guard.off and path.exists() else None
