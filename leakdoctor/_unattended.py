"""A run nobody finished still writes its summary: at interpreter exit, on SIGTERM, at the end of a
multiprocessing child (a DataLoader or Pool worker ends by os._exit, after multiprocessing's finalizers but
without atexit), and when the doctor is dropped and garbage-collected (a doctor built in a function that
returned).

What is registered holds the doctor's engine (_engine.py), which holds nothing that leads back to the
doctor, never the doctor itself: a dropped doctor is collected, its engine finishes then, and gives back
its descriptor and memory; finish() cancels it all (`Registration.cancel`). A copy inherited through a fork
is the parent's to finish: the child's exit, signal or collection leaves it alone (its process id is not
the child's).
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from functools import partial
from typing import Any, Callable

from leakdoctor import _closing as closing
from leakdoctor._engine import Engine
from leakdoctor._lifecycle import oom, termination

__all__ = ["Registration"]


class Registration:
    """The ways `engine` is finished when the script does not finish its doctor (`owner`): at exit, when
    `owner` is collected, at the end of a multiprocessing child, and on SIGTERM unless the framework
    handles it or another doctor finishes this one (`Framework.sigterm`)."""

    def __init__(self, owner: Any, engine: Engine) -> None:
        self.pid = os.getpid()
        engine.registration = self
        engine.termination_key = id(owner)  # SIGTERM's registry knows the engine by the doctor users hold
        self._collected = weakref.finalize(owner, finish_unattended, engine, "collected")
        self._collected.atexit = False  # at exit, the atexit entry below finishes it, in its place among the handlers
        self._exit = partial(finish_unattended, engine, "exit")
        atexit.register(self._exit)
        self._child_exit = _child_finalizer(self._exit)
        termination.register(engine, partial(finish_unattended, engine, "SIGTERM"), weak=True)
        if engine.part.sigterm == "owner":  # registered all the same: the handler is installed for the others
            termination.unregister(engine)

    def cancel(self) -> None:
        """finish() was called: nothing is left to finish unattended."""
        atexit.unregister(self._exit)
        self._collected.detach()
        if self._child_exit is not None:
            self._child_exit.cancel()


def finish_unattended(engine: Engine, how: str, exception: BaseException | None = None) -> None:
    """Finish an engine whose doctor the run never finished: `how` is "exit" (interpreter exit, or the end
    of a multiprocessing child), "collected" (dropped and garbage-collected) or "SIGTERM" (the handler's
    `exception`). Nothing is done for a copy inherited through a fork, nor for a finished one. The framework
    part sees `Ending.unattended` set: it must not wait on other processes then (torch: no collective)."""
    registration = engine.registration
    if registration is None or registration.pid != os.getpid() or engine.result is not None:
        return
    engine.unattended = how
    if exception is None and how == "exit":
        exception = oom.uncaught()
    try:
        closing.finish(engine, exception)
    except Exception as err:  # noqa: BLE001 - never raise from atexit, a signal handler or a collection
        print(f"leakdoctor: could not finish the doctor ({how}): {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        termination.unregister(engine)


def _child_finalizer(finish: Callable[[], Any]) -> Any:
    """In a multiprocessing child, a finalizer that multiprocessing runs as the child ends (its process
    ends by os._exit, without atexit); None elsewhere."""
    import multiprocessing

    if multiprocessing.parent_process() is None:
        return None
    from multiprocessing import util

    return util.Finalize(None, finish, exitpriority=10)
