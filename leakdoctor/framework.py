"""What a framework adds to the one engine: its part (`Framework`), built by its module and handed over.

`leakdoctor.LeakDoctor` is the one engine. A framework module (`leakdoctor.callbacks.torch`, `.flax`,
`.mlx`, `.keras`, `.lightning`) builds a `Framework` that says what differs for it: its integration
(probes, forensics, rules, remedies), how its ranks agree on a stop, how a rank's summary is finished
(gathered, merged with an earlier history), where its metrics go and how its live messages read. The
engine asks the part at fixed points and never the other way round; a part holds no doctor, so that a
doctor nobody holds any more is still collected (and finishes then, from its own state).

    from leakdoctor.framework import Framework
    doctor = LeakDoctor(part=Framework(name="mine", integrations=[my_integration]))

Every field has a default that does what the plain Python doctor does, so a part names only what its
framework changes. See docs/composition.md.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

if TYPE_CHECKING:
    from leakdoctor._base.integration import Integration
    from leakdoctor._base.guard import Guard
    from leakdoctor._lifecycle.stopping import Agree
    from leakdoctor.reporting._exporter import Publisher
    from leakdoctor.reporting.summary import Summary
    from leakdoctor.settings import Settings

__all__ = ["Ending", "Framework", "PLAIN"]


@dataclasses.dataclass(frozen=True)
class Ending:
    """How the run ended, for a part that finishes a rank's summary (`Framework.complete`, `.emits`).

    Attributes:
        exception: what ended the run, if anything (given to finish()).
        unattended: None when the script called finish(); else how the doctor was finished without it:
            "exit" (interpreter exit, or the end of a multiprocessing child), "collected" (dropped and
            garbage-collected) or "SIGTERM". A part must not wait on other processes then.
        stopped_together: the ranks agreed on a stop and this rank stopped with them (every rank left
            the loop at the same step, so every rank reaches finish()).
        steps: the steps the doctor counted.
        settings: the doctor's settings.
        guard: the doctor's guard: a part's own work goes through it (`guard.call(part, fn, ...)`), so that
            a failure is reported once in the summary's errors and never reaches the run.
        write_summary: the doctor's `write_summary` (to `summary_path`, atomically; False when not written).
    """

    exception: BaseException | None
    unattended: str | None
    stopped_together: bool
    steps: int
    settings: Settings
    guard: Guard
    write_summary: Callable[[Summary], bool]


def _alone() -> None:
    return None


def _same(summary: Summary) -> Summary:
    return summary


def _as_is(summary: Summary, ending: Ending) -> Summary:
    return summary


def _always(summary: Summary, ending: Ending) -> bool:
    return True


def _plain(message: str) -> str:
    return message


@dataclasses.dataclass(frozen=True)
class Framework:
    """A framework's part of a doctor: what the engine asks it, each with the plain Python doctor's default.

    Attributes:
        name: the framework, as the summary's `framework` and the exporter's label say it.
        integrations: its probes, forensics, rules, remedies (`leakdoctor.integrations.Integration`),
            added to the process and Python integrations every doctor has.
        leaves_out: forensics (by name) an investigation of this doctor does not run.
        stop_agreement: asked once, at construction, when `on_limit="stop"`: how the ranks of a
            distributed run agree to stop (a collective: the element-wise maximum over the ranks of a few
            integers), or None when this process stops alone.
        checkpoint_on_every_rank: whether every rank calls `checkpoint=` when the ranks stop together
            (a framework whose saving is itself a collective: Lightning's save_checkpoint, JAX's orbax);
            else rank 0 alone does.
        sigterm: who finishes the doctor on SIGTERM: "doctor" (its own handler, _lifecycle/termination.py),
            "framework" (the framework turns SIGTERM into an exception the callback sees: Lightning), or
            "owner" (another doctor finishes this one: a Keras fit's doctor, by the callback's).
        guard: the guard the doctor reports its errors through; a part that guards calls of its own
            (the JAX doctor's optimizer rewrite) passes one and keeps it. None: the doctor makes its own.
        publisher: where its metrics go: given the settings and the guard, the Prometheus feed (None: no
            feed). None: the doctor's own exporter, as the settings ask (`prometheus_port=`).
        continues: every summary the doctor builds, as this framework completes it (a Lightning fit
            continues the summaries of the callback's earlier fits).
        interim: the summary the heartbeat writes while the run goes, from the doctor's own; it must not
            wait on other processes.
        complete: the final summary, once built and its post-mortem added (gathering the ranks' summaries
            into rank 0's; a Keras run's cumulative summary).
        emits: whether the doctor writes, plots and prints that final summary itself.
        words: a live message, as this framework says it (the Keras callback names its clock).
    """

    name: str = "python"
    integrations: Sequence[Integration] = ()
    leaves_out: tuple[str, ...] = ()
    stop_agreement: Callable[[], Agree | None] = _alone
    checkpoint_on_every_rank: bool = False
    sigterm: Literal["doctor", "framework", "owner"] = "doctor"
    guard: Guard | None = None
    publisher: Callable[[Settings, Guard], Publisher | None] | None = None
    continues: Callable[[Summary], Summary] = _same
    interim: Callable[[Summary], Summary] = _same
    complete: Callable[[Summary, Ending], Summary] = _as_is
    emits: Callable[[Summary, Ending], bool] = _always
    words: Callable[[str], str] = _plain

    def with_integrations(self, extra: Sequence[Integration]) -> "Framework":
        """This part with `extra` integrations after its own (a user's `integrations=`)."""
        return dataclasses.replace(self, integrations=[*self.integrations, *extra]) if extra else self

    def keeps(self, forensic: Any) -> bool:
        """Whether an investigation of this doctor runs `forensic`."""
        return forensic.name not in self.leaves_out


#: The plain Python doctor's part: every default.
PLAIN = Framework()
