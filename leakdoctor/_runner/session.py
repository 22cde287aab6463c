"""One `leakdoctor run`: the options every doctor gets, and the one doctor attached at the step the
script reached first (a torch optimizer step, a Trainer, a Keras call, an eager MLX or optax update, a
Flax TrainState.apply_gradients, a call of a compiled or jitted function, or the function named by
--step-on). Steps of any other kind are ignored, so a Lightning fit, whose optimizer is a torch
optimizer, is watched once, by the Lightning callback, and an eager update next to a jitted function
counts once per iteration. A run in which no step was seen still ends with a summary: verdict
"unwatched", with the reason and the fix.

A doctor the script makes itself is joined, never doubled: a Lightning or Keras LeakDoctorCallback the
script passes to its Trainer or fit call (then no callback of the run's is added), and a loop doctor
(torch, MLX, JAX, the engine) the script made before its first step (then the run's steps are the
script's own doctor.step() calls). The joined doctor is the run's: one doctor, one summary. The run's
options apply where the script set none: all of them for a Lightning callback (its doctor is made at fit
start), the summary and plot paths for a doctor already made.

Under torchrun every rank runs `leakdoctor run`: what the runner itself writes (the unwatched summary, the
summary merged with the forked children's) goes where the doctors put theirs, rank 0's to the summary
path, another rank's beside it (ranks.rank_path: leaks.rank1.json), without plot or printing."""

from __future__ import annotations

import dataclasses
import os
import sys
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping

from leakdoctor.reporting import _ranks as ranks

STEPS = ("a torch optimizer step, a Lightning Trainer fit, a Keras fit/evaluate/predict, an MLX "
         "Optimizer.update, an optax update or a Flax TrainState.apply_gradients run eagerly, or a function "
         "compiled by mx.compile, jax.jit, flax.nnx.jit or equinox.filter_jit and called more than once")
NO_STEP = f"the script took no step that leakdoctor recognises ({STEPS})"
FIX = ("name the step with --step-on module:function, e.g. --step-on train_step (a function of the script) or "
       "--step-on mypackage.training:Trainer.step; a step is each return from it")
NO_FIT = "the script made a Lightning Trainer but never fitted it: no training step ran"
#: The kinds of step at which a loop doctor the script made is joined (a loop's optimizer update or compiled call).
LOOPS = ("torch", "mlx", "optax", "flax", "compiled")
#: The kind of a run that joined a loop doctor the script made: the script steps it, the run never does.
SCRIPT = "script"
#: The options a doctor already made takes from the run where the script set none (what it writes, not how it judges).
OUTPUTS = ("summary_path", "plot_path", "html_path")
#: A run whose steps went to processes started by spawn or forkserver (`spawned`: {method: count}).
SPAWNED = ("the script took no step in this process, and started {count} process(es) by {methods} (e.g. a "
           "multiprocessing Pool of that start method), where its steps ran: `leakdoctor run` watches the "
           "script's process and its forked children, not spawned ones")
SPAWNED_FIX = ("start the workers with fork (multiprocessing.get_context(\"fork\")) to have them watched, or "
               "make a LeakDoctor in the worker function (from leakdoctor import LeakDoctor; call its step() "
               "each step, with summary_path=f\"leaks.{os.getpid()}.json\")")


def spawned_unwatched(spawned: Mapping[str, int]) -> dict[str, Any]:
    """The `unwatched` entry of a run whose steps ran in spawned processes: reason, fix and the counts."""
    return {"reason": SPAWNED.format(count=sum(spawned.values()), methods=" and ".join(sorted(spawned))),
            "fix": SPAWNED_FIX, "spawned": dict(spawned)}


class Session:
    def __init__(self, options: Mapping[str, Any], on_limit: str | None = None) -> None:
        self.options = dict(options)
        self.on_limit = on_limit
        self.kind: str | None = None
        self.doctor: Any = None
        self.depth = 0  # updates and compiled calls in progress (they nest), and the doctor's own step
        self.found: dict[str, Any] = {}  # what traced updates showed: {"mlx": (model, optimizer)}
        self.updates = 0  # optimizer updates run or traced so far (a compiled function that traced one trains)
        self.training_compiled = False  # a compiled function of the script traced an optimizer update
        self.joined = False  # whether the doctor is one the script made (joined), not the run's own
        #: the loop doctors the script made (frameworks.patch_engine records them), joined at the first step
        self.made: weakref.WeakSet[Any] = weakref.WeakSet()
        self.making = False  # while the run makes its own doctor (not one of the script's)
        self._first: Any = None

    def attach(self, kind: str, make: Callable[..., Any]) -> Any | None:
        """The doctor (or callback) of `kind`, made by `make(**options)` the first time a step of any
        kind is seen; None when another kind came first or making it failed. At a loop's first step, an
        unfinished doctor the script made is joined instead (and None returned: the script steps it)."""
        if self.kind is None:
            mine = next((d for d in list(self.made) if not d.finished), None) if kind in LOOPS else None
            if mine is not None:
                self.join(SCRIPT, mine)
                return None
            self.kind = kind
            self.making = True
            try:
                self.doctor = make(**self.doctor_options())
            except Exception as err:  # noqa: BLE001 - the script runs on without a doctor
                print(f"leakdoctor run: could not attach to {kind}: {type(err).__name__}: {err}", file=sys.stderr)
            finally:
                self.making = False
        return self.doctor if self.kind == kind else None

    def join(self, kind: str, doctor: Any) -> bool:
        """Make `doctor`, one the script made (a loop doctor, a Lightning or Keras callback), the run's
        doctor, with the run's options where the script set none; False when the run already has one."""
        if self.kind is not None:
            return False
        self.kind, self.doctor, self.joined = kind, doctor, True
        options = self.doctor_options()
        defaults = getattr(doctor, "add_defaults", None)
        if callable(defaults):  # a Lightning callback, whose doctor is made at fit start: every option
            defaults(options)
            return True
        for part in (doctor, getattr(doctor, "doctor", None)):  # a Keras callback, and its doctor of the calls
            settings = getattr(part, "settings", None)
            missing = {name: Path(options[name]) for name in OUTPUTS
                       if options.get(name) is not None and getattr(settings, name, 0) is None}
            if missing:
                part.settings = dataclasses.replace(settings, **missing)
        return True

    def counts(self, source: Any) -> bool:
        """Whether the steps of `source` are the run's steps: those of the first optimizer (or optax
        transformation, or compiled function) that stepped; a second one (a GAN's discriminator, an
        eval_step) does not count again."""
        if self._first is None:
            self._first = source
        return source is self._first

    def step(self, doctor: Any, *args: Any, **context: Any) -> Any:
        """Step a loop doctor; end the run (SystemExit) once it decided to stop before the memory limit."""
        result = doctor.step(*args, **context)
        if getattr(doctor, "should_stop", False):
            raise SystemExit("leakdoctor run: stopped the run before the leak reached the memory limit "
                             "(--on-limit stop); the summary says where")
        return result

    def doctor_options(self) -> dict[str, Any]:
        """The options, with --on-limit's on_limit when it was given."""
        return {**self.options, "on_limit": self.on_limit} if self.on_limit is not None else dict(self.options)

    def forked(self, summary_path: str) -> None:
        """In a forked child (_runner/children.py): no doctor yet, no step seen; the doctor a step of the
        child attaches is quiet and writes to `summary_path` (the parent reads it, and writes the one summary)."""
        self.kind, self.doctor, self._first, self.joined = None, None, None, False
        self.found, self.made = {}, weakref.WeakSet()  # the parent's doctors, copied by the fork, are the parent's
        options = {k: v for k, v in self.options.items() if not k.startswith("prometheus_") and k != "trackers"}
        options.update(summary_path=summary_path, plot_path=None, html_path=None, verbose=False)
        self.options = options

    def finish_child(self) -> None:
        """A forked child ends: finish its doctor, if a step of the child attached one (it writes the
        child's file); nothing otherwise (no step seen in this child is no summary)."""
        if self.kind is not None and self.doctor is not None:
            self.finish()

    def quiet(self) -> bool:
        """Keep the attached loop doctor from writing, plotting and printing its summary (the runner emits
        the summary merged with the children's); False where it cannot (Keras, Lightning callbacks)."""
        from leakdoctor.doctor import LeakDoctor

        if self.kind is None:
            return True
        if isinstance(self.doctor, LeakDoctor) and not self.joined:  # the script's own wrote what it was asked
            self.doctor.settings = dataclasses.replace(self.doctor.settings, summary_path=None, plot_path=None,
                                                       html_path=None, verbose=False)
            return True
        return False

    def destination(self) -> tuple[int, str | None, str | None]:
        """(rank, summary path, plot path) of what the runner writes in this process: the run's options
        on rank 0; on a rank > 0 (process_rank), the rank's own file beside the summary path and no plot,
        as the doctors do (ranks.options_on_rank)."""
        options = ranks.options_on_rank(self.options, process_rank())
        path = options.get("summary_path")
        return options["rank"], (str(path) if path else None), options.get("plot_path")

    def emit(self, summary: Any) -> None:
        """Write, plot, write as HTML and print a summary as the attached doctor would have (printed on rank 0
        only)."""
        rank, path, plot = self.destination()
        if path:
            try:
                summary.write(path)
            except OSError as err:
                print(f"leakdoctor run: could not write {path}: {err}", file=sys.stderr)
        if plot:
            try:
                summary.plot(plot)
            except Exception as err:  # noqa: BLE001 - a plot is a bonus
                print(f"leakdoctor run: could not plot to {plot}: {err}", file=sys.stderr)
        page = ranks.options_on_rank(self.options, process_rank()).get("html_path")
        if page:
            try:
                summary.write_html(page)
            except Exception as err:  # noqa: BLE001 - a page is a bonus, as the plot
                print(f"leakdoctor run: could not write the HTML report to {page}: {err}", file=sys.stderr)
        if self.options.get("verbose", True) and rank == 0:
            print(summary.text(), file=sys.stderr)
        if rank == 0 and self.kind is None:  # no doctor logged it (no step seen, or only the children's)
            from leakdoctor._base import logs

            logs.verdict(summary)

    def finish(self, exception: BaseException | None = None, reason: str | None = None,
               emit: bool = True, spawned: Mapping[str, int] | None = None) -> Any | None:
        """Finish the attached doctor (it writes, plots and prints its summary) and give its summary.
        When no step was seen, the summary says so (verdict "unwatched", `reason`, or NO_STEP), and is
        written and printed here; None when a doctor could not be made. `spawned`: the processes the script
        started without a fork ({method: count}), where its steps ran when this process took none."""
        doctor = self.doctor
        if self.kind is None:
            if spawned and reason is None:
                return self.unwatched(emit=emit, entry=spawned_unwatched(spawned))
            return self.unwatched(reason or NO_STEP, emit)
        if doctor is None:
            return None
        if self.kind == "keras":
            return doctor.finish(exception)
        if self.kind == "lightning":
            if doctor.doctor is None:  # a Trainer that never fitted
                return self.unwatched(reason or NO_FIT, emit)
            return doctor.doctor.finish(exception)
        return doctor.finish(exception)

    def unwatched(self, reason: str = NO_STEP, emit: bool = True, entry: dict[str, Any] | None = None) -> Any:
        """The summary of a run in which no step was seen: written, plotted and printed as the run's options
        ask (unless `emit` is False). `entry`: its `unwatched` (default: `reason`, with --step-on as the fix)."""
        from leakdoctor._base.version import __version__
        from leakdoctor.reporting.summary import Summary

        summary = Summary(framework=framework_imported(self.kind), steps=0, series={}, findings=[],
                          version=__version__, unwatched=entry or {"reason": reason, "fix": FIX},
                          rank=process_rank())
        if emit:
            self.emit(summary)
        return summary


def process_rank() -> int:
    """This process's rank in a distributed run: torch.distributed's when the script initialized it (and
    has not destroyed it yet), else the RANK that torchrun sets (with a WORLD_SIZE above 1); 0 outside one."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001 - a broken torch.distributed: torchrun's RANK still says
        pass
    try:
        world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0
    return rank if world > 1 and 0 <= rank < world else 0


def framework_imported(kind: str | None = None) -> str:
    """The framework of a run without steps: the kind attached, else the one the script imported."""
    if kind is not None:
        return kind
    for module, name in (("lightning", "lightning"), ("pytorch_lightning", "lightning"), ("keras", "keras"),
                         ("mlx.core", "mlx"), ("jax", "jax"), ("torch", "torch")):
        if module in sys.modules:
            return name
    return "python"
