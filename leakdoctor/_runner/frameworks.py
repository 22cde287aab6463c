"""Where each framework's training step is, and how `leakdoctor run` attaches a doctor there without
editing the script. Each `patch_*` takes the framework module just imported and the session:

- torch: a global optimizer step post-hook (torch.optim.Optimizer); the model is found once, as the
  module holding the most of the first optimizer's parameters. Under torch.distributed (torchrun: every
  rank runs `leakdoctor run`) the doctor is finished when the script destroys its default process group,
  while the ranks can still gather their summaries into rank 0's.
- Lightning: every Trainer gets the LeakDoctorCallback (one instance, shared), and DDP ranks that
  Lightning starts as subprocesses run under `leakdoctor run` too, so every rank has the callback.
- Keras: fit/evaluate/predict get the LeakDoctorCallback (one instance, one history across calls).
- MLX: after an eager `Optimizer.update`.
- optax: after the outermost eager `update` of a GradientTransformation (chains nest), and Flax: after
  an eager `TrainState.apply_gradients` (whose returned state carries a rewritten optimizer if
  cond_to_where is applied).
- compiled steps: `mx.compile`, `jax.jit`, `flax.nnx.jit` and `equinox.filter_jit` wrap what the script
  compiles (compiled.py); a step is an outermost call of the first compiled function called twice.
- leakdoctor's own: the loop doctors the script makes are recorded, and a LeakDoctorCallback the script
  passes to a Trainer or a Keras call is found there: the run joins them (session.join), never doubles them.

An update traced inside a compiled function (session.depth > 0: inside our wrapper's call, or while the
doctor itself steps) or under a JAX transformation (its arguments are tracers) is no step: the compiled
function's call is. The first step seen decides the run's kind (session.attach): one doctor, one kind of
step.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from types import ModuleType
from typing import Any, Callable

from leakdoctor._runner import compiled
from leakdoctor._runner.session import Session

#: Modules whose import triggers a patch, and the patch.
TARGETS: dict[str, str] = {
    "torch": "patch_torch",
    "lightning.pytorch.trainer.trainer": "patch_trainer",
    "pytorch_lightning.trainer.trainer": "patch_trainer",
    "lightning.pytorch.strategies.launchers.subprocess_script": "patch_launcher",
    "pytorch_lightning.strategies.launchers.subprocess_script": "patch_launcher",
    "keras": "patch_keras",
    "mlx.optimizers": "patch_mlx",
    "optax": "patch_optax",
    "flax.training.train_state": "patch_train_state",
    "mlx.core": "patch_mlx_compile",
    "jax": "patch_jax_jit",
    "flax.nnx": "patch_nnx_jit",
    "equinox": "patch_filter_jit",
    "leakdoctor.doctor": "patch_engine",
}


def patches(session: Session, relaunch: list[str]) -> dict[str, Callable[[ModuleType], None]]:
    """{module name: patch(module)} for the import hook. `relaunch`: this run's leakdoctor arguments
    before the script (`run --remedies safe ...`), for the DDP subprocesses Lightning starts."""
    extra = {"patch_launcher": (relaunch,)}
    return {name: functools.partial(globals()[fn], session, *extra.get(fn, ())) for name, fn in TARGETS.items()}


# --- torch ----------------------------------------------------------------------------------------

def patch_torch(session: Session, torch: ModuleType) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook  # loaded with torch

    register_optimizer_step_post_hook(functools.partial(_torch_step, session))
    dist = sys.modules.get("torch.distributed")  # imported with torch, when it is built with it
    if dist is not None and hasattr(dist, "destroy_process_group"):
        dist.destroy_process_group = _destroy_process_group(session, dist.destroy_process_group)


def _destroy_process_group(session: Session, original: Callable[..., Any]) -> Callable[..., Any]:
    """torch.distributed.destroy_process_group that first finishes the run's torch doctor, when the
    default group goes (a DDP script's end, on every rank): finish() gathers every rank's summary into
    rank 0's with a collective, which the runner's end, after the group is gone, could no longer make."""

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs.get("group")
        if group is None and session.kind == "torch" and session.doctor is not None:
            try:
                session.finish()
            except Exception as err:  # noqa: BLE001 - the script's own call goes on
                print(f"leakdoctor run: could not finish the doctor: {type(err).__name__}: {err}", file=sys.stderr)
        return original(*args, **kwargs)

    return destroy_process_group


def _torch_step(session: Session, optimizer: Any, args: Any, kwargs: Any) -> None:
    doctor = session.attach("torch", functools.partial(_torch_doctor, optimizer))
    if doctor is not None and session.counts(optimizer):
        session.step(doctor)


def with_others(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with the integrations of the other frameworks this process imported (a torch loop that also
    jits with JAX): the pytest plugin's doctor loads the same (loaded.py), so a bug gets one answer."""
    from leakdoctor._runner.loaded import imported, integration_of

    others = [integration_of(name) for name in imported() if name != kind]
    return {**options, "integrations": [*options.get("integrations", ()), *others]} if others else options


def _torch_doctor(optimizer: Any, **options: Any) -> Any:
    from leakdoctor.callbacks.torch import LeakDoctor

    return LeakDoctor(model=model_of(optimizer), optimizer=optimizer, **with_others("torch", options))


def model_of(optimizer: Any) -> Any:
    """The torch module that holds the most of `optimizer`'s parameters (of two that hold as many, the
    one with more submodules: the outer model, or the DDP wrapper); None if no module holds any. Looked
    for first among the variables of the calling frames (the training loop's model, at no cost), then
    among every live module (a walk of the heap: a tenth of a second in a large process)."""
    import torch

    from leakdoctor.integrations._holders import live_instances

    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    near = _holding_most(_modules_in_frames(torch.nn.Module), params)
    if near is not None and all(id(p) in params for p in near.parameters()) and \
            len({id(p) for p in near.parameters()}) == len(params):
        return near  # it holds all of them: no module holds more
    return _holding_most(live_instances(torch.nn.Module), params)


def _modules_in_frames(base: type) -> list[Any]:
    """The instances of `base` that the calling frames' local and global variables name."""
    found: dict[int, Any] = {}
    frame = sys._getframe(1)
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for value in list(scope.values()):
                if isinstance(value, base):
                    found.setdefault(id(value), value)
        frame = frame.f_back
    return list(found.values())


def _holding_most(modules: list[Any], params: set[int]) -> Any:
    """Of `modules`, the one that holds the most of `params` (then the one with more submodules); None if
    none holds any."""
    best, best_key = None, (0, 0)
    for module in modules:
        held = sum(1 for p in module.parameters() if id(p) in params)
        key = (held, sum(1 for _ in module.modules()))
        if held and key > best_key:
            best, best_key = module, key
    return best


# --- Lightning ------------------------------------------------------------------------------------

def patch_trainer(session: Session, module: ModuleType) -> None:
    trainer = module.Trainer
    original = trainer.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        own = _script_callback(kwargs.get("callbacks"), "leakdoctor.callbacks.lightning")
        if own is not None:  # the script's own: joined (Lightning refuses two stateful callbacks of a type)
            session.join("lightning", own)
        else:
            callback = session.attach("lightning", _lightning_callback)
            if callback is not None:
                kwargs["callbacks"] = _with(kwargs.get("callbacks"), callback)
        original(self, *args, **kwargs)

    trainer.__init__ = __init__


def _script_callback(callbacks: Any, module: str) -> Any | None:
    """The LeakDoctorCallback of leakdoctor's `module` among the callbacks the script passes (None, one,
    a list, or Keras's CallbackList), if any."""
    kind = getattr(sys.modules.get(module), "LeakDoctorCallback", None)
    if kind is None or callbacks is None:
        return None
    if isinstance(callbacks, (list, tuple)):
        listed = list(callbacks)
    else:
        listed = list(getattr(callbacks, "callbacks", [callbacks]))
    return next((c for c in listed if isinstance(c, kind)), None)


def _lightning_callback(**options: Any) -> Any:
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    return LeakDoctorCallback(**options)


def patch_launcher(session: Session, relaunch: list[str], module: ModuleType) -> None:
    """Lightning starts DDP ranks 1.. as `python script.py args`; run them under `leakdoctor run` with
    the same options, so every rank has the callback (rank 0 gathers every rank's findings)."""

    def _basic_subprocess_cmd() -> list[str]:
        return [sys.executable, "-m", "leakdoctor", *relaunch, os.path.abspath(sys.argv[0]), *sys.argv[1:]]

    if hasattr(module, "_basic_subprocess_cmd"):
        module._basic_subprocess_cmd = _basic_subprocess_cmd


# --- Keras ----------------------------------------------------------------------------------------

def patch_keras(session: Session, keras: ModuleType) -> None:
    for name in ("fit", "evaluate", "predict"):
        setattr(keras.Model, name, _keras_call(session, getattr(keras.Model, name)))


def _keras_call(session: Session, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # arguments Keras will refuse with its own message
            bound = None
        own = _script_callback(bound.arguments.get("callbacks"), "leakdoctor.callbacks.keras") if bound else None
        if own is not None:  # the script's own callback: joined, and no second one added
            session.join("keras", own)
            callback = None
        else:
            callback = session.attach("keras", _keras_callback)
        if callback is not None and bound is not None:
            bound.arguments["callbacks"] = _with(bound.arguments.get("callbacks"), callback)
            args, kwargs = bound.args[1:], bound.kwargs
        return original(self, *args, **kwargs)

    return call


def _keras_callback(**options: Any) -> Any:
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    return LeakDoctorCallback(**options)


def _with(callbacks: Any, callback: Any) -> Any:
    """The user's callbacks (None, one, a list, or Keras's CallbackList, left as it is) plus ours."""
    if callbacks is None:
        return [callback]
    if hasattr(callbacks, "callbacks") and not isinstance(callbacks, (list, tuple)):
        return callbacks  # Keras's own CallbackList: fit passing its callbacks on to evaluate
    listed = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    return listed if any(c is callback for c in listed) else [*listed, callback]


# --- doctors the script makes ---------------------------------------------------------------------

def patch_engine(session: Session, module: ModuleType) -> None:
    """Record each loop doctor (the engine, the torch/MLX/JAX doctors) the script makes, so that the run
    joins it at the first step instead of attaching a second doctor (session.attach). Not the run's own
    doctors, nor those the Lightning and Keras callbacks make (the callback is what is joined)."""
    engine = module.LeakDoctor
    original = engine.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            if not session.making and type(self).framework not in ("lightning", "keras"):
                session.made.add(self)
        except Exception as err:  # noqa: BLE001 - the script's doctor is made all the same; the run may double it
            print(f"leakdoctor run: could not note the script's doctor: {type(err).__name__}: {err}", file=sys.stderr)

    engine.__init__ = __init__


# --- MLX ------------------------------------------------------------------------------------------

def patch_mlx(session: Session, optimizers: ModuleType) -> None:
    optimizer_class = optimizers.Optimizer
    original = optimizer_class.update

    @functools.wraps(original)
    def update(self: Any, model: Any, gradients: Any) -> Any:
        session.updates += 1
        session.depth += 1  # an update a subclass makes through this one is part of it
        try:
            result = original(self, model, gradients)
        finally:
            session.depth -= 1
        if session.depth:  # traced inside mx.compile (or run by the doctor): the compiled call is the step
            session.found.setdefault("mlx", (model, self))
            return result
        doctor = session.attach("mlx", functools.partial(_mlx_doctor, model, self))
        if doctor is not None and session.counts(self):
            session.depth += 1
            try:
                session.step(doctor)
            finally:
                session.depth -= 1
        return result

    optimizer_class.update = update


def _mlx_doctor(model: Any, optimizer: Any, **options: Any) -> Any:
    from leakdoctor.callbacks.mlx import LeakDoctor

    return LeakDoctor(model=model, optimizer=optimizer, **with_others("mlx", options))


def patch_mlx_compile(session: Session, core: ModuleType) -> None:
    """`mx.compile`: the model and optimizer of the update traced inside the first compiled step (if
    any) are the doctor's, so that force_eval has the state to evaluate."""
    def make(**options: Any) -> Any:
        model, optimizer = session.found.get("mlx", (None, None))
        return _mlx_doctor(model, optimizer, **options)

    compiled.patch(session, core, "compile", make, factory=False)


# --- compiled JAX steps ---------------------------------------------------------------------------

def patch_jax_jit(session: Session, jax: ModuleType) -> None:
    compiled.patch(session, jax, "jit", _jax_doctor, compiled.jax_tracing())


def patch_nnx_jit(session: Session, nnx: ModuleType) -> None:
    compiled.patch(session, nnx, "jit", _jax_doctor, compiled.jax_tracing())


def patch_filter_jit(session: Session, equinox: ModuleType) -> None:
    compiled.patch(session, equinox, "filter_jit", _jax_doctor, compiled.jax_tracing())


# --- optax and Flax -------------------------------------------------------------------------------

def patch_optax(session: Session, optax: ModuleType) -> None:
    """Every GradientTransformation made from now on counts its outermost eager update as a step."""
    transformation = optax.GradientTransformation
    original = transformation.__new__

    def __new__(cls: type, init: Any, update: Any) -> Any:
        made: list[Any] = []
        tx = original(cls, init, _counted(session, update, made))
        made.append(tx)
        return tx

    transformation.__new__ = __new__


def _counted(session: Session, update: Callable[..., Any], made: list[Any]) -> Callable[..., Any]:
    @functools.wraps(update)
    def counted(*args: Any, **kwargs: Any) -> Any:
        session.updates += 1
        session.depth += 1
        try:
            result = update(*args, **kwargs)
        finally:
            session.depth -= 1
        if session.depth == 0 and made and args and not _traced(args[0]):
            _optax_step(session, made[0], args, kwargs)
        return result

    return counted


def _optax_step(session: Session, tx: Any, args: Any, kwargs: Any) -> None:
    doctor = session.attach("optax", functools.partial(_jax_doctor, tx=tx))
    if doctor is None or not session.counts(tx):
        return
    updates, state = args[0], args[1] if len(args) > 1 else kwargs.get("state")
    params = args[2] if len(args) > 2 else kwargs.get("params")
    session.depth += 1  # the doctor's own scan of the update (traced) is no step
    try:
        session.step(doctor, opt_state=state, params=updates if params is None else params)
    finally:
        session.depth -= 1


def patch_train_state(session: Session, module: ModuleType) -> None:
    state_class = module.TrainState
    original = state_class.apply_gradients

    @functools.wraps(original)
    def apply_gradients(self: Any, *, grads: Any, **kwargs: Any) -> Any:
        session.updates += 1
        session.depth += 1  # the optax update inside is part of this step
        try:
            state = original(self, grads=grads, **kwargs)
        finally:
            session.depth -= 1
        if session.depth or _traced(grads):
            return state
        doctor = session.attach("flax", _jax_doctor)
        if doctor is None:
            return state
        session.depth += 1
        try:
            return session.step(doctor, state)
        finally:
            session.depth -= 1

    state_class.apply_gradients = apply_gradients


def _jax_doctor(**options: Any) -> Any:
    from leakdoctor.callbacks.jax import LeakDoctor

    return LeakDoctor(**with_others("jax", options))


def _traced(tree: Any) -> bool:
    """Whether `tree` holds jax tracers, or JAX is tracing (the update runs inside jit, grad or a scan:
    not a step of its own)."""
    import jax

    if _jax_tracing():
        return True
    leaves = jax.tree_util.tree_leaves(tree)
    return bool(leaves) and isinstance(leaves[0], jax.core.Tracer)


@functools.lru_cache(maxsize=1)
def _jax_tracing_test() -> Callable[[], bool]:
    return compiled.jax_tracing()


def _jax_tracing() -> bool:
    return _jax_tracing_test()()
