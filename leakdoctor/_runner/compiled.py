"""Compiled and jitted steps: `mx.compile`, `jax.jit`, `flax.nnx.jit` and `equinox.filter_jit` are
patched when the script imports their module (frameworks.py), so that the functions the script compiles
come back wrapped in a `Compiled`: a transparent callable (same result; the compiled object's attributes,
`.lower`, `.trace`, `.clear_cache`, `__code__`, reachable; isinstance as the compiled object).

A step is an outermost call of a compiled function made by the script: not a call made while another
compiled function is being traced or run (`session.depth` > 0), nor one made under a JAX transformation
(jax.grad, vmap, scan: the trace state is not clean). Functions that libraries compile (MLX's compiled
activations, flax's and equinox's own jax.jit) come back unwrapped: only a compile called from the user's
own files (integrations.source.is_user_file) is wrapped.

Of several compiled functions (train_step and eval_step; apply_model and update_model), the step is the
first one called a second time, so a one-off (a `jax.jit(lambda ...)` made anew, an evaluation before
training) never becomes it; its first call is counted as a step too, when it is chosen. Once a compiled
function has traced an optimizer update (optax, Flax's apply_gradients, MLX's Optimizer.update), only
such a function can become the step: an evaluation's loss function called over a test set between two
training steps does not. The session's
one-kind rule (session.attach) keeps eager framework steps and compiled steps from both counting: the
first step seen decides.
"""

from __future__ import annotations

import functools
import sys
import types
from types import ModuleType
from typing import Any, Callable

from leakdoctor._base.source import is_user_file
from leakdoctor._runner.session import Session

#: The keyword under which each compiler takes the function (a call without it is a decorator factory,
#: `@jax.jit(static_argnums=0)`, `@eqx.filter_jit(donate="all")`, `@nnx.jit(...)`).
_FUN_KEYWORDS = ("fun", "f", "fn")


def patch(session: Session, module: ModuleType, name: str, make: Callable[..., Any],
          tracing: Callable[[], bool] = lambda: False, factory: bool = True) -> None:
    """Replace `module.name` (a compiler) by one whose results, when compiled from the user's files, are
    Compiled. `make(**options)`: the doctor, made when a compiled function becomes the step; `tracing()`:
    whether a call at depth 0 is made under a transformation of the framework (then it is no step);
    `factory`: the compiler called without the function returns a decorator (jax.jit(static_argnums=0))."""
    original = getattr(module, name)
    if getattr(original, "__leakdoctor_compiler__", False):
        return

    @functools.wraps(original)
    def compiler(*args: Any, **kwargs: Any) -> Any:
        if factory and not args and not any(k in kwargs for k in _FUN_KEYWORDS):
            return functools.partial(compiler, **kwargs)  # the decorator factory: ours, not the library's
        compiled = original(*args, **kwargs)
        if not callable(compiled) or isinstance(compiled, Compiled) or not _from_user(sys._getframe(1)):
            return compiled
        return Compiled(session, compiled, make, tracing)

    compiler.__leakdoctor_compiler__ = True  # type: ignore[attr-defined]
    setattr(module, name, compiler)


def _from_user(frame: Any) -> bool:
    """Whether the compiler was called from the user's own files (not a library's, not leakdoctor's)."""
    return frame is not None and _user_file(frame.f_code.co_filename)


@functools.lru_cache(maxsize=256)
def _user_file(filename: str) -> bool:
    return is_user_file(filename)


class Compiled:
    """A compiled function of the script, stepping the run's doctor after each call that is a step."""

    def __init__(self, session: Session, fn: Callable[..., Any], make: Callable[..., Any],
                 tracing: Callable[[], bool]) -> None:
        self.__dict__.update(__wrapped__=fn, _leakdoctor=(session, make, tracing), _leakdoctor_calls=0,
                             _leakdoctor_trains=False)
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                self.__dict__[attr] = getattr(fn, attr)
            except AttributeError:
                continue

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        session, _, tracing = self._leakdoctor
        doctor = None
        if not session.depth and not tracing():  # else traced, or inside another compiled call: no step
            self._leakdoctor_calls += 1
            if self._leakdoctor_calls > 1:
                doctor = self._doctor()
        updates = session.updates
        session.depth += 1  # one frame of ours in the script's tracebacks
        try:
            result = self.__wrapped__(*args, **kwargs)
        finally:
            session.depth -= 1
        if session.updates > updates:  # it traced (or ran) an optimizer update: a training step
            self.__dict__["_leakdoctor_trains"] = True
            session.training_compiled = True
        if doctor is not None:
            _step(session, doctor)
        return result

    def _doctor(self) -> Any:
        """The doctor to step after this call, when this function's calls are the run's steps (on its
        second call, the first function to get one becomes the step: its first call is stepped now)."""
        session, make, _ = self._leakdoctor
        if session.training_compiled and not self._leakdoctor_trains:
            return None  # an evaluation's function, while one that trains is there to be the step
        session.depth += 1  # what making the doctor runs is no step
        try:
            doctor = session.attach("compiled", make)
        finally:
            session.depth -= 1
        if doctor is None or not session.counts(self):
            return None
        if self._leakdoctor_calls == 2:
            _step(session, doctor)  # the first call, now known to have been a step
        return doctor

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        """A method compiled in a class body binds as a function does."""
        return self if instance is None else types.MethodType(self, instance)

    def __getattr__(self, name: str) -> Any:
        try:
            fn = self.__dict__["__wrapped__"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(fn, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(step, <the compiled type>) holds, as for the object itself
        return type(self.__dict__["__wrapped__"])

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def _step(session: Session, doctor: Any) -> None:
    """Step the doctor; what it runs (an evaluation, a scan) is no step of the script's."""
    session.depth += 1
    try:
        session.step(doctor)
    finally:
        session.depth -= 1


def jax_tracing() -> Callable[[], bool]:
    """A test of whether JAX is tracing now (jit, grad, vmap, scan): a call then is part of another
    computation. Made once JAX is imported; without JAX's trace_state_clean, the depth guard alone."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:
        return lambda: False
    return lambda: not trace_state_clean()
