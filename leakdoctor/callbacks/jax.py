"""The JAX loop doctor, for every JAX training loop: Flax (TrainState and NNX), bare Optax and Equinox.

    from leakdoctor.callbacks.jax import LeakDoctor

    with LeakDoctor(remedies="all", summary_path="leaks.json") as doctor:     # Flax TrainState
        for x, y in batches:
            state, loss = train_step(state, x, y)
            state = doctor.step(state)        # the same state, or one whose tx a remedy rewrote

    doctor = LeakDoctor(optimizer=optimizer, model=model)     # Flax NNX: nnx.Optimizer and its model
    ...   optimizer.update(model, grads); doctor.step()       # a swap replaces optimizer.tx in place

    doctor = LeakDoctor(tx=optax.radam(1e-3))                 # bare optax: use doctor.tx in the loop
    tx = doctor.tx; opt_state = tx.init(params)
    ...   updates, opt_state = tx.update(grads, opt_state, params)
          doctor.step(opt_state=opt_state, params=params)

The doctor watches live arrays and backend compiles. When a loop compiles on every step it names the
function and why; if the cause is the optimizer's un-jitted `lax.cond` (the old optax RAdam), remedies
"all" rewrites the optimizer's update (cond_to_where) and from then on `step` hands back the state with
the rewritten transformation (same init, same optimizer state, the same arithmetic: results equal to
rounding, not bit for bit). The optimizer arguments are held only while `step` runs, so the doctor keeps
no state, params or optimizer state alive.

In a multi-process JAX run (jax.distributed.initialize, jax.process_count() > 1) every process measures
itself: `rank` defaults to jax.process_index(), and a process > 0 writes its summary beside the summary
path (leaks.json -> leaks.rank1.json, ranks.rank_path), no plot; nothing is gathered: each process's file
holds its own findings. on_limit="stop" stops every process together, at the same step: at agreement
steps (as under torch.distributed, see stopping.py) one process_allgather of three integers says whether any
process asked. `checkpoint=` is called on every process (JAX's checkpointing, orbax, is itself a
collective). Every process must call step() once a step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leakdoctor import doctor
from leakdoctor.framework import Framework
from leakdoctor.integrations import _jax as jax_integration
from leakdoctor.integrations._jax import OptimizerCall
from leakdoctor._lifecycle import stopping
from leakdoctor._base.guard import Guard
from leakdoctor.reporting import _ranks as ranks
from leakdoctor.settings import DoctorOptions, documented

if TYPE_CHECKING:
    from typing_extensions import Unpack

_MISSING = object()


def _is_transformation(tx: Any) -> bool:
    return isinstance(tx, tuple) and callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))


@documented
class LeakDoctor(doctor.LeakDoctor):
    """The JAX loop doctor (Flax TrainState and NNX, bare Optax, Equinox): `leakdoctor.LeakDoctor` with
    JAX's probes (live arrays, backend compiles), forensics, rules and the cond_to_where swap. Named
    `LeakDoctor` like the engine and the other loop doctors (one class name, a module per
    framework), so the import alone says the framework.

    Args:
        tx: the optax GradientTransformation of a bare optax (or Equinox) loop, or None; then use
            `doctor.tx` in the loop and call `doctor.step(opt_state=..., params=...)`.
        optimizer: a Flax NNX `nnx.Optimizer`, with `model`; or None. A Flax TrainState needs neither:
            pass it to `step`.
        model: the `nnx.Module` that `optimizer` updates (given with it), or None.
        **options: the shared options, below (README "Options"). `rank` defaults to jax.process_index()
            in a multi-process run.

    Raises:
        UnknownOptionError: an argument or option name it does not take, with the nearest valid one (a
            ValueError and a TypeError both).
        ValueError: a bad value, named with the valid ones.

    Example:
        >>> from leakdoctor.callbacks.jax import LeakDoctor
        >>> with LeakDoctor(remedies="all") as doctor:  # doctest: +SKIP
        ...     for x, y in batches:
        ...         state, loss = train_step(state, x, y)
        ...         state = doctor.step(state)  # the same state, or one whose tx a remedy rewrote
        >>> doctor.summary.verdict  # doctest: +SKIP
        'clean'
    """

    framework = "jax"

    def __init__(self, *, tx: Any = None, optimizer: Any = None, model: Any = None,
                 **options: Unpack[DoctorOptions]) -> None:
        jax_integration.require()
        if tx is not None and not _is_transformation(tx):
            raise ValueError(f"tx={tx!r}: expected an optax GradientTransformation or None")
        if optimizer is not None and not (_is_transformation(getattr(optimizer, "tx", None))
                                          and hasattr(optimizer, "opt_state")):
            raise ValueError(f"optimizer={optimizer!r}: expected a flax.nnx.Optimizer (with .tx and .opt_state) "
                             f"or None")
        if (optimizer is None) != (model is None):
            raise ValueError("optimizer= and model= go together: the nnx.Optimizer and the nnx.Module it updates")
        self._tx = tx
        self._tx_now = tx
        self._proxy = _proxy(tx, self._proxy_update) if tx is not None else None
        self._optimizer, self._model = optimizer, model
        self._originals: dict[int, tuple[Any, Any]] = {}
        self._now: tuple[Any, Any, Any] | None = None
        rank = jax_integration.process_rank()
        if rank is not None:  # a multi-process run: this process's own summary, beside process 0's
            options = ranks.options_on_rank(options, rank)
        self._guard = Guard()  # the doctor's, shared: a failed rewrite is in the summary's errors
        integration = jax_integration.integration(lambda: self._optimizer_call(*self._now) if self._now else None)
        # JAX's checkpointing (orbax) is itself a collective: every process saves when the processes stop together.
        part = Framework(name=type(self).framework, integrations=[integration], stop_agreement=_stop_agreement,
                         checkpoint_on_every_rank=True, guard=self._guard)
        super().__init__(part=part, **options)

    @property
    def tx(self) -> Any:
        """For bare optax loops: a GradientTransformation whose update is the current one (the one
        passed as `tx=`, or its rewrite once cond_to_where is applied)."""
        if self._tx is None:
            raise ValueError("doctor.tx: pass tx=<your optax transformation> to LeakDoctor(...) first")
        return self._proxy

    def step(self, state: Any = None, /, *, opt_state: Any = _MISSING, params: Any = _MISSING, **context: Any) -> Any:
        """Call at the end of every training step. `state`: a Flax TrainState (returned, possibly with
        a rewritten tx), an nnx.Optimizer, or anything (returned as is). Bare optax loops pass
        `opt_state=` and `params=`. Other keyword arguments reach remedies (see leakdoctor.LeakDoctor)."""
        if self.quiet_step():  # no remedy can have been applied: only a rewrite handed out before is handed again
            return self._swap(state) if self._originals else state
        self._now = (state, opt_state, params)  # what the cond scan reads, while the engine works
        try:
            super().step(**context)
        finally:
            self._now = None
        return self._swap(state) if self._originals or self.active_remedies else state

    # --- what the cond scan sees --------------------------------------------------------------------

    def _optimizer_call(self, state: Any, opt_state: Any, params: Any) -> OptimizerCall | None:
        """The current optimizer update's transformation and arguments (abstractly traced, never run)."""
        if _is_train_state(state):
            return OptimizerCall(self._original(state.tx), state.params, state.opt_state, state.params)
        if self._optimizer is not None:
            return self._nnx_call()
        if self._tx is not None and opt_state is not _MISSING and params is not _MISSING:
            return OptimizerCall(self._tx, params, opt_state, params)
        return None

    def _nnx_call(self) -> OptimizerCall:
        from flax import nnx

        optimizer = self._optimizer
        params = nnx.as_pure(nnx.state(self._model, optimizer.wrt, graph=getattr(optimizer, "graph", None)))
        return OptimizerCall(self._original(optimizer.tx), params, nnx.as_pure(optimizer.opt_state), params)

    # --- handing back the rewritten transformation ----------------------------------------------------

    def _swap(self, state: Any) -> Any:
        if self._tx is not None:
            self._tx_now = self._current(self._tx)
        if self._optimizer is not None:
            wanted = self._current(self._original(self._optimizer.tx))
            if wanted is not self._optimizer.tx:
                self._optimizer.tx = wanted
        if _is_train_state(state):
            wanted = self._current(self._original(state.tx))
            if wanted is not state.tx:
                state = state.replace(tx=wanted)
        return state

    def _current(self, tx: Any) -> Any:
        """`tx` as the active remedies want it (rewritten by cond_to_where, or as it is)."""
        for remedy in self.active_remedies:
            transform = getattr(remedy, "transform_optimizer", None)
            if transform is not None:
                new = self._guard.call(f"remedy {remedy.name}", transform, tx, default=tx)
                if new is not tx:
                    self._originals[id(new)] = (new, tx)
                    return new
        return tx

    def _original(self, tx: Any) -> Any:
        """The user's transformation behind a rewrite this doctor handed out."""
        entry = self._originals.get(id(tx))
        return entry[1] if entry is not None and entry[0] is tx else tx

    def _proxy_update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return self._tx_now.update(updates, state, params, **extra)


def _stop_agreement() -> stopping.Agree | None:
    """How the processes of a multi-process JAX run agree to stop: a process_allgather (None in a single
    process: the doctor stops alone)."""
    return jax_integration.process_maximum if jax_integration.process_count() > 1 else None


def _proxy(tx: Any, update: Any) -> Any:
    """A transformation with `tx`'s init and the given update (kwargs pass through, as optax's
    GradientTransformationExtraArgs does)."""
    try:
        import optax
    except ImportError as err:
        raise ImportError("LeakDoctor(tx=...) needs optax: pip install leakdoctor[jax]") from err
    return optax.GradientTransformationExtraArgs(tx.init, update)


def _is_train_state(state: Any) -> bool:
    """A flax.training TrainState or alike: tx, opt_state and params, and a replace method."""
    return _is_transformation(getattr(state, "tx", None)) and hasattr(state, "opt_state") \
        and hasattr(state, "params") and callable(getattr(state, "replace", None))


__all__ = ["LeakDoctor"]
