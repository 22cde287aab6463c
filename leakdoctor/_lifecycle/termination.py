"""SIGTERM: every live doctor writes its summary before the process ends.

Cluster schedulers and preemption stop jobs with SIGTERM, whose default action ends the process at once,
so without a handler no summary is written. Doctors and callbacks register here when they start and
unregister when they finish. A callback registers itself (held strongly until it finishes); a doctor
registers `weak`: only a function that finishes its state, so that a doctor nobody holds any more can be
collected (and finish then, doctor.py). A forked child forgets what its parent registered: the parent's
doctors are the parent's to finish, and a worker's SIGTERM must not write their summaries.

One process-wide handler, installed once, from the main thread, when the first doctor registers. On
SIGTERM it finishes every live doctor (in the order they started), then hands the signal on: to the handler installed
before it if that was a Python callable; if it was the default action, it restores that and sends the
signal again, so the exit status still says SIGTERM (-15, or 143 in a shell). Where SIGTERM was ignored
nothing is installed, and it stays ignored.

A framework that owns SIGTERM itself is left to it: Lightning's SignalConnector turns SIGTERM into a
SIGTERMException at the next step (and on SLURM requeues the job), which reaches the callback's
on_exception. A doctor whose engine says `framework_handles_sigterm` (its framework part's `sigterm` is
"framework", leakdoctor/framework.py) installs nothing, is not
finished here, and while it lives the handler does not end the process itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

#: key -> (the object, or None when registered weak; its finish; whether a framework handles SIGTERM for it)
_live: dict[int, tuple[Any, Callable[[BaseException], Any], bool]] = {}
_previous: Any = None
_installed = False
_handling = False
_finishing = 0  # finishes in progress in this process (their summaries not written yet)
_deferred: int | None = None  # a SIGTERM that came while one was in progress


class SIGTERM(Exception):
    """The process received SIGTERM; a doctor finished by the handler notes "the run ended with SIGTERM"."""


def register(obj: Any, finish: Callable[[BaseException], Any] | None = None, *, weak: bool = False,
             install: bool = True) -> None:
    """Until `unregister(obj)`, on SIGTERM call `finish(SIGTERM())` (default: obj.finish). `weak`: keep only
    `finish` (which must not hold `obj`), not `obj` itself. The key is `obj.termination_key` when it has
    one (a doctor's engine: its doctor's id, the doctor being the object users hold), else id(obj).
    `install=False`: called only if a doctor installs the handler (a clean-up, not a reason to install it)."""
    owned = _owned(obj)
    _live[_key(obj)] = (None if weak else obj, finish if finish is not None else obj.finish, owned)
    if not owned and install:
        _install()


def unregister(obj: Any) -> None:
    _live.pop(_key(obj), None)


def _key(obj: Any) -> int:
    key = getattr(obj, "termination_key", None)
    return key if isinstance(key, int) else id(obj)


def _forget_inherited() -> None:
    """In a forked child: what the parent registered is the parent's to finish."""
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited)


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
    for key, (obj, finish, owned) in list(_live.items()):
        if owned:
            continue
        try:
            finish(exception)
        except Exception as err:  # noqa: BLE001 - one doctor's failure must not keep the others from writing
            print(f"leakdoctor: could not finish {type(obj if obj is not None else finish).__name__} on SIGTERM: "
                  f"{type(err).__name__}: {err}", file=sys.stderr)
        _live.pop(key, None)


@contextmanager
def finishing() -> Iterator[None]:
    """Around a doctor's finish: a SIGTERM that comes meanwhile (a Pool worker finishing its doctor as it
    ends, terminated by its parent at that moment) takes effect once the summary is written, instead of
    ending the process in the middle of the write. A second SIGTERM goes straight on."""
    global _finishing, _deferred
    _finishing += 1
    try:
        yield
    finally:
        _finishing -= 1
        if _finishing == 0 and _deferred is not None:
            signum, _deferred = _deferred, None
            os.kill(os.getpid(), signum)  # handled now, by the main thread: the other doctors, then the signal's way


def _handle(signum: int, frame: Any) -> None:
    global _handling, _deferred
    if _handling or _deferred is not None:  # a second SIGTERM while finishing goes straight on
        _chain(signum, frame)
        return
    if _finishing:  # a summary is being written: the signal waits for it (see finishing)
        _deferred = signum
        return
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
    if previous is signal.SIG_IGN or any(owned for _, _, owned in list(_live.values())):
        return  # ignored before; or a framework ends the run its own way
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
            pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)  # delivered to this thread: the process ends here
    os._exit(128 + signal.SIGTERM)  # only reached if this thread blocks SIGTERM
