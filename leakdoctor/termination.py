"""SIGTERM: every live doctor writes its summary before the process ends.

Cluster schedulers and preemption stop jobs with SIGTERM, whose default action ends the process at once,
so without a handler no summary is written. Doctors and callbacks register here when they start and
unregister when they finish; the registry holds them strongly, so a doctor nobody finished stays
reachable for this handler and for the engine's atexit fallback.

One process-wide handler, installed once, from the main thread, when the first doctor registers. On
SIGTERM it finishes every live doctor (in the order they started), then hands the signal on: to the handler installed
before it if that was a Python callable; if it was the default action, it restores that and sends the
signal again, so the exit status still says SIGTERM (-15, or 143 in a shell). Where SIGTERM was ignored
nothing is installed, and it stays ignored.

A framework that owns SIGTERM itself is left to it: Lightning's SignalConnector turns SIGTERM into a
SIGTERMException at the next step (and on SLURM requeues the job), which reaches the callback's
on_exception. A doctor whose class sets `framework_handles_sigterm = True` installs nothing, is not
finished here, and while it lives the handler does not end the process itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable

_live: dict[int, tuple[Any, Callable[[BaseException], Any]]] = {}
_previous: Any = None
_installed = False
_handling = False


class SIGTERM(Exception):
    """The process received SIGTERM; a doctor finished by the handler notes "the run ended with SIGTERM"."""


def register(obj: Any, finish: Callable[[BaseException], Any] | None = None) -> None:
    """Keep `obj` until `unregister(obj)`; on SIGTERM call `finish(SIGTERM())` (default: obj.finish)."""
    _live[id(obj)] = (obj, finish if finish is not None else obj.finish)
    if not _owned(obj):
        _install()


def unregister(obj: Any) -> None:
    _live.pop(id(obj), None)


def installed() -> bool:
    """Whether this module's handler is the process's SIGTERM handler now."""
    return _installed and signal.getsignal(signal.SIGTERM) is _handle


def _owned(obj: Any) -> bool:
    return bool(getattr(obj, "framework_handles_sigterm", False))


def _install() -> None:
    """Install the handler once, from the main thread, unless SIGTERM is ignored or handled in C."""
    global _installed, _previous
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_IGN or current is None:
            return
        signal.signal(signal.SIGTERM, _handle)
    except (ValueError, OSError):  # not the main interpreter, or no signals here
        return
    _previous, _installed = current, True


def finish_all(exception: BaseException) -> None:
    """Finish every live doctor that no framework handles (in the order they started)."""
    for key, (obj, finish) in list(_live.items()):
        if _owned(obj):
            continue
        try:
            finish(exception)
        except Exception as err:  # noqa: BLE001 - one doctor's failure must not keep the others from writing
            print(f"leakdoctor: could not finish {type(obj).__name__} on SIGTERM: {type(err).__name__}: {err}",
                  file=sys.stderr)
        _live.pop(key, None)


def _handle(signum: int, frame: Any) -> None:
    global _handling
    if not _handling:  # a second SIGTERM while finishing goes straight on
        _handling = True
        try:
            finish_all(SIGTERM(f"signal {signum}"))
        finally:
            _handling = False
    _chain(signum, frame)


def _chain(signum: int, frame: Any) -> None:
    """Hand the signal to what was installed before, or take the default action."""
    previous = _previous
    if callable(previous):
        previous(signum, frame)
        return
    if previous is signal.SIG_IGN or any(_owned(obj) for obj, _ in list(_live.values())):
        return  # ignored before; or a framework ends the run its own way
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
            pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)  # delivered to this thread: the process ends here
    os._exit(128 + signal.SIGTERM)  # only reached if this thread blocks SIGTERM
