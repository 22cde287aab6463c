"""The Lightning callback:

    from leakdoctor.callbacks.lightning import LeakDoctorCallback
    trainer = L.Trainer(callbacks=[LeakDoctorCallback(remedies="safe", summary_path="leaks.json")])

At fit start a doctor starts on the LightningModule (its hooks, and its list/dict attributes such as
`self.training_step_outputs`, which are counted) and the first optimizer. It steps after every training
batch (validation batches are not steps) and logs its readings to the trainer's loggers under
`log_prefix` every `log_every_n_steps` steps and after each validation. At train end, or on an exception
(KeyboardInterrupt included), it finishes: rank 0 gathers every rank's findings, prints the summary and
writes `summary_path`. Checkpoints keep the doctor's step count, findings and notes (`state_dict`), so a
resumed run counts on and keeps its findings; the memory series start afresh in the new process, after a
new warm-up. In DDP the checkpoint holds rank 0's state, which every rank resumes from. Another fit() with
the same callback continues its history the same way in this process: the steps count on and the findings
of the earlier fits stay in the summary, which each fit's end writes again.

With `on_limit="stop"`, when an unremedied leak is projected to reach the memory limit within the margin,
the callback saves a checkpoint (`trainer.save_checkpoint`) into the ModelCheckpoint's folder, else
`default_root_dir/checkpoints`, calls `checkpoint=` if given, and sets `trainer.should_stop`; resume with
`Trainer.fit(ckpt_path=...)`. Under DDP (any strategy with several ranks) the ranks stop together, as
Lightning's EarlyStopping does: a rank whose leak is near the limit asks, and at agreement steps (the same
batches on every rank: the first after `window`, each setting the next, see stopping.py) one collective of
the strategy (`trainer.strategy.reduce`, a max over three integers) says whether any rank asked; if one did, every rank saves (`trainer.save_checkpoint` is a collective; `checkpoint=` is called on
rank 0 alone) and sets `trainer.should_stop` at that step. Rank 0's summary says in `stopped_by` which
rank asked, at which step and why.

Works with `lightning` and `pytorch_lightning`: the class derives from the Callback of each of the two that
is imported when this module is imported (lightning.pytorch if neither is), so import Lightning first.
Importing this module imports Lightning; without it, an ImportError names the extra to install.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import warnings
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from leakdoctor import _options as doctor_options
from leakdoctor._base.findings import Finding
from leakdoctor._base.guard import Guard
from leakdoctor._base.messages import codes, msg, unique
from leakdoctor.callbacks.torch import LeakDoctor
from leakdoctor.doctor import STATE_SCHEMA
from leakdoctor.framework import PLAIN, Framework
from leakdoctor._lifecycle.stopping import Agree
from leakdoctor.reporting.summary import Summary
from leakdoctor.settings import DoctorOptions, documented

__all__ = ["LeakDoctorCallback", "LightningDoctor"]

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


class LightningDoctor(LeakDoctor):
    """The torch doctor of one fit. `earlier`: the final summary of the callback's previous fit, which
    this one continues: its steps count on from there, and the findings, notes and errors of the earlier
    fits stay in the summary (a finding belongs to the fit that found it: a clean later fit does not
    make it a growth that stopped). The series are this fit's."""

    framework = "lightning"

    def __init__(self, *, earlier: Summary | None = None, agree: Agree | None = None, **options: Any) -> None:
        # Lightning's SignalConnector turns SIGTERM into a SIGTERMException at the next step during fit (and
        # requeues on SLURM); on_exception then finishes this doctor: leakdoctor's own handler keeps out.
        # Lightning's save_checkpoint is a collective that every rank enters (rank 0 writes the file).
        # The ranks agree on a stop through the strategy's collective when the trainer runs several ranks
        # (`agree`), never torch.distributed directly: the strategy knows its own collectives.
        part = Framework(name=type(self).framework, stop_agreement=lambda: agree, sigterm="framework",
                         checkpoint_on_every_rank=True,
                         continues=partial(continued, earlier) if earlier is not None else PLAIN.continues)
        super().__init__(part=part, **options)
        self._earlier = earlier
        if earlier is not None:
            self.load_state_dict({"schema": STATE_SCHEMA, "steps": earlier.steps, "findings": [], "notes": []})

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._earlier is not None:
            now = [Finding.from_dict(f) for f in state["findings"]]
            state["findings"] = [f.to_dict() for f in _merged(self._earlier.findings, now)]
            state["notes"] = unique(self._earlier.notes + state["notes"])
        return state


_EARLIER_FITS = "earlier_fits"  # the code of the note that says so


def continued(earlier: Summary, summary: Summary) -> Summary:
    """This fit's summary with what the earlier fits found: their findings (replaced by this fit's where
    the cause, metric and place are the same), notes and errors."""
    notes = [msg(_EARLIER_FITS, steps=earlier.steps)] + [n for n in earlier.notes if _EARLIER_FITS not in codes(n)]
    return dataclasses.replace(
        summary, findings=_merged(earlier.findings, summary.findings), notes=unique(notes + summary.notes),
        errors=earlier.errors + [e for e in summary.errors if e not in earlier.errors])


def _merged(earlier: list[Finding], now: list[Finding]) -> list[Finding]:
    latest = {f.key: f for f in now}
    kept = [latest.pop(f.key, f) for f in earlier]
    return kept + [f for f in now if f.key in latest]


def _callback_class() -> type:
    """Lightning's Callback: of each Lightning package already imported (a class deriving from both when
    both are), else lightning.pytorch's, else pytorch_lightning's."""
    bases = tuple(sys.modules[name].Callback for name in _PACKAGES if name in sys.modules)
    for name in () if bases else _PACKAGES:
        try:
            bases = (importlib.import_module(name).Callback,)
            break
        except ImportError:
            continue
    if not bases:
        raise ImportError("leakdoctor.callbacks.lightning needs Lightning: pip install leakdoctor[lightning]")
    return bases[0] if len(bases) == 1 else type("Callback", bases, {})


if TYPE_CHECKING:
    from lightning.pytorch import Callback
    from typing_extensions import Unpack
else:
    Callback = _callback_class()


@documented
class LeakDoctorCallback(Callback):
    """A Lightning callback that watches memory while the Trainer fits, names leaks, remedies them when
    allowed (`remedies=`) and writes one summary; see the module's docstring for what it does when.

    Each fit gets a doctor (the torch doctor, on the LightningModule and the first optimizer); its own work
    goes through a guard: if it fails, it is reported once and switched off, and training goes on.

    Args:
        log_prefix: the prefix of the readings logged to the trainer's loggers (`leakdoctor/rss_bytes`).
        watch_model: count the LightningModule's list/dict attributes every step (the same argument as
            the torch doctor's). Its old name, `watch_module=`, still works, with a DeprecationWarning.
        **options: the shared options, below (README "Options"). `rank` is the trainer's global rank.

    Raises:
        UnknownOptionError: an argument or option name it does not take, with the nearest valid one (a
            ValueError and a TypeError both).
        ValueError: a bad value, named with the valid ones.
        ImportError: at import of this module, when Lightning is not installed.

    Example:
        >>> import lightning as L
        >>> from leakdoctor.callbacks.lightning import LeakDoctorCallback
        >>> doctor = LeakDoctorCallback(remedies="safe", summary_path="leaks.json")
        >>> trainer = L.Trainer(max_epochs=3, callbacks=[doctor])  # doctest: +SKIP
        >>> trainer.fit(model, datamodule)  # doctest: +SKIP
        >>> doctor.summary.verdict  # doctest: +SKIP
        'clean'
    """

    def __init__(self, *, log_prefix: str = "leakdoctor", watch_model: bool = True,
                 **options: Unpack[DoctorOptions]) -> None:
        super().__init__()
        if "watch_module" in options:  # the old name, kept out of the signature and of the suggestions
            warnings.warn("LeakDoctorCallback(watch_module=...) is deprecated: use watch_model=, as for the torch "
                          "doctor", DeprecationWarning, stacklevel=2)
            watch_model = options.pop("watch_module")  # type: ignore[typeddict-item]
        doctor_options.check(type(self), options)  # bad names and values fail here, not at fit start
        if not isinstance(log_prefix, str) or not log_prefix:
            raise ValueError(f"log_prefix={log_prefix!r}: expected a non-empty string such as 'leakdoctor'")
        if not isinstance(watch_model, bool):
            raise ValueError(f"watch_model={watch_model!r}: expected True or False")
        self._options = dict(options)
        self.log_prefix = log_prefix
        self.watch_model = watch_model
        self.doctor: LightningDoctor | None = None
        self._resumed: dict[str, Any] | None = None
        self._logged_step = -1
        self._guard = Guard()

    def add_defaults(self, options: dict[str, Any]) -> None:
        """Take `options` (valid doctor options) where this callback was given none, for the doctors of
        the fits to come: `leakdoctor run`'s, when it joins a callback the script made."""
        doctor_options.check(type(self), {**options, **self._options})
        self._options = {**options, **self._options}

    @property
    def summary(self) -> Summary:
        """The doctor's summary: final once training ended (or `finish()`), else a snapshot of the fit so
        far. Before the first fit there is no doctor yet: a summary of 0 steps whose verdict is
        "unwatched" (its `unwatched` says why: fit() has not started)."""
        return self.doctor.summary if self.doctor is not None else _not_started()

    def finish(self, exception: BaseException | None = None) -> Summary:
        """End the run's doctor, if a fit started one (training's end and exceptions already do; safe to
        call again), and return its final summary; before any fit, `summary`'s "unwatched" one."""
        return self.doctor.finish(exception) if self.doctor is not None else _not_started()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """A doctor for this fit. It resumes a checkpoint's state if one was loaded for this fit, and else
        continues the previous fit's doctor (its steps, its findings)."""
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        previous, resumed, self._resumed = self.doctor, self._resumed, None
        earlier = self._guard.call("continue", previous.finish) if previous is not None and not resumed else None
        options = {**self._options, "rank": trainer.global_rank}
        if options.get("on_limit") == "stop":
            options["checkpoint"] = _saver(trainer, options.get("checkpoint"), self._guard)
        agree = _agreement(trainer) if trainer.world_size > 1 else None
        self.doctor = self._guard.call("start", LightningDoctor, model=pl_module, optimizer=optimizer,
                                       watch_model=self.watch_model, earlier=earlier, agree=agree, **options)
        if self.doctor is not None and resumed:
            self._guard.call("resume", self.doctor.load_state_dict, resumed)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.doctor is None:
            return
        self.doctor.step()
        if self.doctor.should_stop:
            trainer.should_stop = True
        every = trainer.log_every_n_steps
        if every and trainer.global_step % every == 0:
            self._guard.call("logging", self._log, trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.doctor is not None and not trainer.sanity_checking:
            self._guard.call("logging", self._log, trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.doctor is not None:
            self.doctor.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.doctor is not None:
            self.doctor.finish(exception)

    def state_dict(self) -> dict[str, Any]:
        if self.doctor is not None:
            return self.doctor.state_dict()
        return dict(self._resumed or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed = dict(state_dict) if state_dict else None

    def _log(self, trainer: Any) -> None:
        """The latest readings, once per global step, to every logger."""
        step = trainer.global_step
        if self.doctor is None or step == self._logged_step or not trainer.loggers:
            return
        self._logged_step = step
        readings = self.doctor.readings
        for logger in trainer.loggers:
            separator = getattr(logger, "group_separator", "/")
            logger.log_metrics({f"{self.log_prefix}{separator}{k}": v for k, v in readings.items()}, step=step)


def _not_started() -> Summary:
    """The summary of a callback no fit has used yet."""
    return Summary("lightning", 0, {}, [], unwatched={
        "reason": "fit() has not started: the callback's doctor starts at fit start",
        "fix": "pass the callback to a Trainer and call trainer.fit(...)"})


def _agreement(trainer: Any) -> Agree:
    """How the trainer's ranks agree to stop: the strategy's own collective (as EarlyStopping's
    reduce_boolean_decision is), the element-wise maximum over the ranks of a few integers."""
    def agree(values: list[int]) -> list[int]:
        import torch

        flags = torch.tensor(values, dtype=torch.int64, device=trainer.strategy.root_device)
        return [int(v) for v in trainer.strategy.reduce(flags, reduce_op="max").tolist()]

    return agree


def _saver(trainer: Any, user: Callable[[], Any] | None, guard: Guard) -> Callable[[], str]:
    """The checkpoint on_limit="stop" takes: the user's `checkpoint=` (guarded, on rank 0 alone), then the
    trainer's own (on every rank: a collective, whose file rank 0 writes)."""
    def save() -> str:
        if user is not None and trainer.is_global_zero:
            guard.call("checkpoint", user)
        folder = getattr(trainer.checkpoint_callback, "dirpath", None) or os.path.join(trainer.default_root_dir,
                                                                                       "checkpoints")
        path = os.path.join(folder, f"leakdoctor-stop-step={trainer.global_step}.ckpt")
        trainer.save_checkpoint(path)
        return path

    return save
