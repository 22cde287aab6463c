"""Never hurt the run: every probe, forensic, cleanup, rule and remedy call goes through a Guard.
An exception is reported once (a LeakDoctorWarning and an entry in the summary), and the part that
raised is switched off for the rest of the run."""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, TypeVar

from leakdoctor._base import logs

__all__ = ["ENGINE", "LeakDoctorWarning", "Guard", "warn"]

T = TypeVar("T")

#: The guard's names for the engine itself (the step's work, concluding at finish(), building the summary),
#: as opposed to one probe, forensic or remedy: one of these switched off means the run was not watched.
ENGINE = ("leakdoctor", "finish", "summary")


class LeakDoctorWarning(RuntimeWarning):
    """Something in leakdoctor failed or was switched off; the training run goes on."""


class Guard:
    """Calls parts by name; the first exception of a part switches that part off."""

    def __init__(self) -> None:
        self.errors: list[dict[str, str]] = []
        self.off: set[str] = set()

    def call(self, part: str, fn: Callable[..., T], *args: Any, default: Any = None, **kwargs: Any) -> T | Any:
        if part in self.off:
            return default
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the user's run must go on whatever a part raises
            self.disable(part, f"{type(err).__name__}: {err}")
            return default

    def engine_error(self) -> dict[str, str] | None:
        """The first error that switched the engine itself off (ENGINE), or None while it runs: a run
        whose engine is off was not watched, whatever it found before (never called clean)."""
        return next((e for e in self.errors if e["part"] in ENGINE), None)

    def disable(self, part: str, reason: str) -> None:
        """Switch `part` off and report why, once."""
        if part in self.off:
            return
        self.off.add(part)
        self.errors.append({"part": part, "error": reason})
        warn(logs.Alert(f"leakdoctor: {part} failed ({reason}); switched off for the rest of the run", "error",
                        part=part, error=reason), stacklevel=5)

    def failed_once(self, part: str, reason: str, then: str) -> None:
        """Report that `part` failed (`then`: what it does next), once a run, and leave it on: for a part
        that tries again (the heartbeat's writes, after a disk was full for a moment)."""
        if any(e["part"] == part for e in self.errors):
            return
        self.errors.append({"part": part, "error": reason})
        warn(logs.Alert(f"leakdoctor: {part} failed ({reason}); {then}", "error", part=part, error=reason),
             stacklevel=5)


def warn(message: str, stacklevel: int = 2) -> None:
    """Issue a LeakDoctorWarning at the user's line that led to it (the innermost frame of the user's own
    code: `train.py:42`, not torch/optim/optimizer.py where a framework hook called the doctor); with no
    user frame on the stack (another thread), `stacklevel` frames up, as warnings.warn counts. A warning
    filter that turns it into an exception (`-W error`, pytest's `filterwarnings = error`) must not carry
    it into the user's loop: the message goes to stderr instead, and what failed is already recorded (the
    summary's errors). An alert (logs.Alert) is logged too, on the "leakdoctor" logger."""
    from leakdoctor._base.source import user_frame

    logs.alert(message)
    message = str(message)  # the warning holds the text, never the alert's finding (nor what that holds)
    frame = user_frame(sys._getframe(1))
    try:
        if frame is None:
            warnings.warn(message, LeakDoctorWarning, stacklevel=stacklevel)
            return
        where = frame.f_globals
        warnings.warn_explicit(message, LeakDoctorWarning, frame.f_code.co_filename, frame.f_lineno,
                               module=where.get("__name__"), registry=where.setdefault("__warningregistry__", {}),
                               module_globals=where)
    except Exception:  # noqa: BLE001 - the filter raised the warning; the run goes on
        print(message, file=sys.stderr)
