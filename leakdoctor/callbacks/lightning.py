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
`Trainer.fit(ckpt_path=...)`. Under DDP one rank cannot stop (or save) alone without hanging the others,
so there "stop" acts as "warn".

Works with `lightning` and `pytorch_lightning`: the class derives from the Callback of each of the two that
is imported when it is first used (lightning.pytorch if neither is), so import Lightning first.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable

from leakdoctor import options as doctor_options
from leakdoctor.callbacks.torch import LeakDoctor
from leakdoctor.doctor import STATE_SCHEMA
from leakdoctor.guard import Guard
from leakdoctor.summary import Finding, Summary

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


class LightningDoctor(LeakDoctor):
    """The torch doctor of one fit. `earlier`: the final summary of the callback's previous fit, which
    this one continues: its steps count on from there, and the findings, notes and errors of the earlier
    fits stay in the summary (a finding belongs to the fit that found it: a clean later fit does not
    make it a growth that stopped). The series are this fit's."""

    framework = "lightning"
    #: Lightning's SignalConnector turns SIGTERM into a SIGTERMException at the next step during fit (and
    #: requeues on SLURM); on_exception then finishes this doctor. leakdoctor's own handler keeps out.
    framework_handles_sigterm = True

    def __init__(self, *, earlier: Summary | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._earlier = earlier
        if earlier is not None:
            self.load_state_dict({"schema": STATE_SCHEMA, "steps": earlier.steps, "findings": [], "notes": []})

    def _build_summary(self) -> Summary:
        summary = super()._build_summary()
        return summary if self._earlier is None else continued(self._earlier, summary)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._earlier is not None:
            now = [Finding.from_dict(f) for f in state["findings"]]
            state["findings"] = [f.to_dict() for f in _merged(self._earlier.findings, now)]
            state["notes"] = list(dict.fromkeys(self._earlier.notes + state["notes"]))
        return state


_EARLIER_FITS = "were earlier fits with this callback: their findings are kept, the series are this fit's"


def continued(earlier: Summary, summary: Summary) -> Summary:
    """This fit's summary with what the earlier fits found: their findings (replaced by this fit's where
    the cause, metric and place are the same), notes and errors."""
    notes = [f"steps 1-{earlier.steps} {_EARLIER_FITS}"] + [n for n in earlier.notes if _EARLIER_FITS not in n]
    return dataclasses.replace(
        summary, findings=_merged(earlier.findings, summary.findings), notes=list(dict.fromkeys(notes + summary.notes)),
        errors=earlier.errors + [e for e in summary.errors if e not in earlier.errors])


def _merged(earlier: list[Finding], now: list[Finding]) -> list[Finding]:
    latest = {f.key: f for f in now}
    kept = [latest.pop(f.key, f) for f in earlier]
    return kept + [f for f in now if f.key in latest]


class _Hooks:
    """What LeakDoctorCallback does; the class itself adds Lightning's Callback base(s). The callback's own
    work (starting the doctor, logging) goes through a Guard: if it fails, it is reported once and
    switched off, and training goes on."""

    def __init__(self, *, remedies: Any = "off", summary_path: Any = None, plot_path: Any = None,
                 log_prefix: str = "leakdoctor", watch_module: bool = True, **options: Any) -> None:
        super().__init__()
        self._options = dict(remedies=remedies, summary_path=summary_path, plot_path=plot_path, **options)
        # bad names and values fail here, not at fit start
        doctor_options.check("LeakDoctorCallback", self._options, own=("log_prefix", "watch_module"))
        if not isinstance(log_prefix, str) or not log_prefix:
            raise ValueError(f"log_prefix={log_prefix!r}: expected a non-empty string such as 'leakdoctor'")
        if not isinstance(watch_module, bool):
            raise ValueError(f"watch_module={watch_module!r}: expected True or False")
        self.log_prefix = log_prefix
        self.watch_module = watch_module
        self.doctor: LightningDoctor | None = None
        self._resumed: dict[str, Any] | None = None
        self._logged_step = -1
        self._guard = Guard()

    @property
    def summary(self) -> Any:
        """The doctor's summary (final after training ended, else a snapshot); None before fit."""
        return self.doctor.summary if self.doctor is not None else None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """A doctor for this fit. It resumes a checkpoint's state if one was loaded for this fit, and else
        continues the previous fit's doctor (its steps, its findings)."""
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        previous, resumed, self._resumed = self.doctor, self._resumed, None
        earlier = self._guard.call("continue", previous.finish) if previous is not None and not resumed else None
        options = {**self._options, "rank": trainer.global_rank}
        if options.get("on_limit") == "stop":  # (under DDP the torch doctor makes it "warn")
            options["checkpoint"] = _saver(trainer, options.get("checkpoint"), self._guard)
        self.doctor = self._guard.call("start", LightningDoctor, model=pl_module, optimizer=optimizer,
                                       watch_model=self.watch_module, earlier=earlier, **options)
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


def _saver(trainer: Any, user: Callable[[], Any] | None, guard: Guard) -> Callable[[], str]:
    """The checkpoint on_limit="stop" takes: the user's `checkpoint=` (guarded), then the trainer's own."""
    def save() -> str:
        if user is not None:
            guard.call("checkpoint", user)
        folder = getattr(trainer.checkpoint_callback, "dirpath", None) or os.path.join(trainer.default_root_dir,
                                                                                       "checkpoints")
        path = os.path.join(folder, f"leakdoctor-stop-step={trainer.global_step}.ckpt")
        trainer.save_checkpoint(path)
        return path

    return save


def _callback_bases() -> tuple[type, ...]:
    """The Callback class of each Lightning package in use; lightning.pytorch's if none is imported yet."""
    bases = tuple(sys.modules[name].Callback for name in _PACKAGES if name in sys.modules)
    if bases:
        return bases
    for name in _PACKAGES:
        try:
            return (__import__(name, fromlist=["Callback"]).Callback,)
        except ImportError:
            continue
    raise ImportError("LeakDoctorCallback needs Lightning: pip install leakdoctor[lightning]")


def __getattr__(name: str) -> Any:
    """Build LeakDoctorCallback on first use, so importing this module imports no framework by itself."""
    if name != "LeakDoctorCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = type("LeakDoctorCallback", (_Hooks, *_callback_bases()), {
        "__module__": __name__,
        "__qualname__": "LeakDoctorCallback",
        "__doc__": "A Lightning callback that watches memory, names leaks, remedies them when allowed "
                   "(`remedies=`) and writes a summary. Options: those of leakdoctor.LeakDoctor, plus "
                   "`log_prefix` (logger metric prefix) and `watch_module` (count the LightningModule's "
                   "list/dict attributes).",
    })
    globals()[name] = cls
    return cls
