"""One `leakdoctor run`: the options every doctor gets, and the one doctor attached at the step the
script reached first (a torch optimizer step, a Trainer, a Keras call, an MLX or optax update, or the
function named by --step-on). Steps of any other framework are ignored, so a Lightning fit, whose
optimizer is a torch optimizer, is watched once, by the Lightning callback."""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Mapping

NO_STEP = ("leakdoctor run: the script took no step that leakdoctor recognises (a torch optimizer step, a "
           "Lightning Trainer fit, a Keras fit/evaluate/predict, an MLX Optimizer.update, an optax update "
           "or a Flax TrainState.apply_gradients, run eagerly); name the step with --step-on module:function")


class Session:
    def __init__(self, options: Mapping[str, Any], on_limit: str | None = None) -> None:
        self.options = dict(options)
        self.on_limit = on_limit
        self.kind: str | None = None
        self.doctor: Any = None
        self.depth = 0  # optimizer updates in progress (chained optax transformations nest)
        self._first: Any = None

    def attach(self, kind: str, make: Callable[..., Any]) -> Any | None:
        """The doctor (or callback) of `kind`, made by `make(**options)` the first time a step of any
        kind is seen; None when another kind came first or making it failed."""
        if self.kind is None:
            self.kind = kind
            try:
                self.doctor = make(**self.doctor_options())
            except Exception as err:  # noqa: BLE001 - the script runs on without a doctor
                print(f"leakdoctor run: could not attach to {kind}: {type(err).__name__}: {err}", file=sys.stderr)
        return self.doctor if self.kind == kind else None

    def counts(self, source: Any) -> bool:
        """Whether the steps of `source` are the run's steps: those of the first optimizer (or optax
        transformation) that stepped; a second one (a GAN's discriminator) does not count again."""
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
        """The options, with on_limit only where this leakdoctor's doctors take it."""
        options = dict(self.options)
        if self.on_limit is not None:
            from leakdoctor.doctor import LeakDoctor

            if "on_limit" in inspect.signature(LeakDoctor.__init__).parameters:
                options["on_limit"] = self.on_limit
            else:
                print("leakdoctor run: this leakdoctor has no on_limit=; --on-limit is ignored", file=sys.stderr)
        return options

    def finish(self, exception: BaseException | None = None) -> Any | None:
        """Finish the attached doctor (it writes, plots and prints its summary); its summary, or None
        when no step was seen."""
        doctor = self.doctor
        if self.kind is None:
            print(NO_STEP, file=sys.stderr)
        if doctor is None:
            return None
        if self.kind == "keras":
            return doctor.finish(exception)
        if self.kind == "lightning":
            if doctor.doctor is None:  # a Trainer that never fitted
                print(NO_STEP, file=sys.stderr)
                return None
            return doctor.doctor.finish(exception)
        return doctor.finish(exception)
