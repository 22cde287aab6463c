"""The plain PyTorch loop doctor:

    from leakdoctor.callbacks.torch import LeakDoctor
    with LeakDoctor(model=model, optimizer=opt, remedies="safe", summary_path="leaks.json") as doctor:
        for x, y in loader:
            ...forward, backward, optimizer.step()...
            doctor.step()

The engine plus the PyTorch integration: device memory, the model's hooks, tensors that keep their
autograd graph across steps, DataLoader workers; the model's list attributes are watched too. Under
torch.distributed every rank measures itself, and `finish()` (on every rank) hands rank 0 one summary
with every rank's findings (`ranks` in the JSON); only rank 0 writes the summary file and prints. Every
other rank writes its own summary beside it (leaks.json -> leaks.rank3.json, ranks.rank_path): while the
run goes (heartbeat=, oom_watermark=: a rank the kernel killed leaves its post-mortem) and at its end, so
that a rank that died of an exception (an out-of-memory error, with its `oom` entry) leaves the summary
rank 0 never gathered; after a run that ended normally it completes the file only if it wrote one while
the run went. The merged summary names each rank's file that exists (`ranks[].file`). A doctor the
script never finished (finished at exit, on SIGTERM or when collected) gathers nothing: a collective at
exit can wait forever for a rank that has gone or waits for this one; its summary says so.

Under torch.distributed, on_limit="stop" stops every rank together, at the same step: a rank that left
the loop alone would leave the others waiting for it in their next collective. A rank whose leak is near
the limit asks; at agreement steps (the same on every rank: the first after `window` steps, each agreement
setting the steps to the next, see stopping.py) one all_reduce of three integers says whether any rank
asked, and then `should_stop` is True on
every rank at that step. Rank 0 alone calls `checkpoint=` (one checkpoint). The summary's `stopped_by`
says which rank asked, at which step and why; the all_reduces' time is in its overhead. Every rank must
call step() once a step, as a DDP loop does.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from leakdoctor import doctor
from leakdoctor.framework import PLAIN, Ending, Framework
from leakdoctor._base.integration import Integration
from leakdoctor._base.messages import msg
from leakdoctor.integrations import _torch as torch_integration
from leakdoctor._lifecycle import stopping
from leakdoctor.reporting import _ranks as ranks
from leakdoctor.reporting.summary import Summary
from leakdoctor.settings import DoctorOptions, Settings, documented

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["LeakDoctor"]


@documented
class LeakDoctor(doctor.LeakDoctor):
    """The plain PyTorch loop doctor: `leakdoctor.LeakDoctor` with PyTorch's probes (device memory, the
    model's hooks, tensors that keep their autograd graph across steps, DataLoader workers), forensics and
    remedies. Named `LeakDoctor` like the engine and the other loop doctors (one class name, a
    module per framework), so the import alone says the framework.

    Args:
        model: the `torch.nn.Module` being trained, or None: its hooks are watched, and its list/dict
            attributes too unless `watch_model=False`.
        optimizer: its `torch.optim.Optimizer`, or None.
        watch_model: count the model's list/dict attributes every step, so that one that keeps growing
            (outputs appended to `self.outputs`) is named.
        part: the framework part of a wrapper (Lightning's, `leakdoctor.framework.Framework`), which the
            PyTorch part completes; None: the plain one.
        **options: the shared options, below (README "Options"). `rank` defaults to torch.distributed's.

    Raises:
        UnknownOptionError: an argument or option name it does not take, with the nearest valid one (a
            ValueError and a TypeError both).
        ValueError: a bad value, named with the valid ones.

    Example:
        >>> from leakdoctor.callbacks.torch import LeakDoctor
        >>> with LeakDoctor(model=model, optimizer=opt, remedies="safe") as doctor:  # doctest: +SKIP
        ...     for x, y in loader:
        ...         loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
        ...         doctor.step()
        >>> doctor.finish().verdict  # doctest: +SKIP
        'clean'
    """

    framework = "torch"

    def __init__(self, *, model: Any = None, optimizer: Any = None, watch_model: bool = True,
                 part: Framework | None = None, **options: Unpack[DoctorOptions]) -> None:
        if not isinstance(watch_model, bool):
            raise ValueError(f"watch_model={watch_model!r}: expected True or False")
        integration = torch_integration.integration(model=model, optimizer=optimizer)
        rank = torch_integration.distributed_rank()
        if rank is not None:  # rank 0 writes the summary of every rank; another rank, its own beside it
            options = ranks.options_on_rank(options, rank)
        part = torch_part(part or Framework(name=type(self).framework), integration,
                          rank_file=rank is not None and options.get("rank", 0) > 0)
        super().__init__(part=part, **options)
        if model is not None and watch_model:
            self.watch_object(torch_integration.unwrap(model))


def torch_part(given: Framework, integration: Integration, *, rank_file: bool) -> Framework:
    """`given` (the plain part, or a wrapper's such as Lightning's) with PyTorch's integration first, the
    gathering of the ranks' summaries (`Gathering`), and torch.distributed's stop agreement unless `given`
    has its own. `rank_file`: summary_path is this rank's own file, beside rank 0's (rank > 0 under
    torch.distributed)."""
    gathering = Gathering(rank_file)
    agreement = given.stop_agreement if given.stop_agreement is not PLAIN.stop_agreement else _stop_agreement
    return dataclasses.replace(given, integrations=[integration, *given.integrations], stop_agreement=agreement,
                               complete=gathering.complete, emits=gathering.emits)


def _stop_agreement() -> stopping.Agree | None:
    """How the ranks agree to stop: torch.distributed's all_reduce (None on one rank: the doctor stops
    alone)."""
    return torch_integration.rank_maximum if torch_integration.world_size() > 1 else None


class Gathering:
    """How a rank's summary is finished under torch.distributed: every rank's gathered into rank 0's."""

    def __init__(self, rank_file: bool) -> None:
        #: whether summary_path is this rank's own file, beside rank 0's (rank > 0 under torch.distributed)
        self.rank_file = rank_file
        self.gathered = False  # whether finish() handed this rank's summary to rank 0

    def complete(self, summary: Summary, ending: Ending) -> Summary:
        """Gather every rank's summary into rank 0's; not after an exception, when the other ranks may
        never reach the collective, nor when the script never called finish() (the doctor finished at
        interpreter exit, on a signal or when it was collected): the other ranks may be gone, or be
        waiting for this one to exit (a parent that joins its rank), and a collective would wait forever."""
        exception = ending.exception
        if isinstance(exception, SystemExit) and ending.stopped_together:
            exception = None  # every rank left the loop at this step, and reaches finish() too
        if exception is not None or ending.unattended:
            return _alone(summary, exception, ending)
        own = self._own_file(ending.settings)
        if own is not None and self.rank_file:  # completed before rank 0 lists it in the merged summary
            ending.guard.call("rank summary", ending.write_summary, summary)  # never keeps a rank from gathering
        gathered = torch_integration.gather((summary.to_dict(), own))
        self.gathered = gathered is not None
        if gathered is None or ending.settings.rank != 0:
            return summary
        summaries = [Summary.from_dict(s) for s, _ in gathered]
        return ranks.merge(summaries, files={s.rank: file for s, (_, file) in zip(summaries, gathered)})

    def _own_file(self, settings: Settings) -> str | None:
        """The file that holds this rank's own summary at the end of a run whose summaries are gathered:
        rank 0's summary path (the merged summary), another rank's file only if it wrote one while the
        run went (its final summary completes it before the gathering, so that a merged summary never lists
        a file still being written); None otherwise."""
        path = settings.summary_path
        if path is None or self.rank_file and not path.exists():
            return None
        return str(path)

    def emits(self, summary: Summary, ending: Ending) -> bool:
        """As every doctor; but a rank > 0 whose summary rank 0 gathered writes its own file only to complete
        the one it wrote while the run went (heartbeat, oom_watermark): its findings are in rank 0's file.
        One whose summary was not gathered (an exception, an unattended finish) writes it: its post-mortem."""
        path = ending.settings.summary_path
        return not (self.rank_file and self.gathered and path is not None and not path.exists())


def _alone(summary: Summary, exception: BaseException | None, ending: Ending) -> Summary:
    """This rank's summary, not gathered: with a note that says why, when there are other ranks."""
    world = torch_integration.world_size()
    if world < 2:
        return summary
    unattended = ending.unattended
    if exception is not None:
        why = msg("ended_with", error=type(exception).__name__)
    else:
        why = msg("never_finished", how=msg("at_exit") if unattended == "exit" else msg(
            "when_collected") if unattended == "collected" else msg("on_signal", signal=unattended))
    note = msg("not_gathered", why=why, others=world - 1, rank=ending.settings.rank)
    return dataclasses.replace(summary, notes=[*summary.notes, note])


