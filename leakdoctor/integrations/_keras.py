"""Keras 3 knowledge: which fit/evaluate/predict calls used which model, the backend's own probes (the
JAX or the torch integration, TensorFlow's GPU memory), and the rules for the two Keras leaks.

Models built in a loop (keras#2102): a Keras model sits in reference cycles (layers, their nodes, its
jitted or traced step functions point back at it), so dropping it frees nothing until a full garbage
collection, which Python runs rarely on a heap as large as a framework's. Old models and what they hold
stay for a while, the C heap fragments around them, and resident memory grows fit after fit (measured
here: +1 to 4 MiB per model of 1 MiB on the jax backend, +0.6 to 1 MiB on torch).
`keras.backend.clear_session()` before each new model stops it: besides resetting Keras's global state,
it runs that full collection at a fixed point, so each model's memory is reused by the next. The
callback registers each call's model (`Calls`), so the rule tells this from other growth: new models in
most calls, and memory growing by at least half of what one model holds per new model (less is the heap
settling around models that come and go, which a loop calling clear_session shows too: benign).
Models the program keeps (a sweep's list of fitted models) survive that collection: the finding names
the place that keeps them (integrations/_holders.py) and its line.

Retracing: on the JAX backend `fit`, `evaluate` and `predict` compile their step function for every new
input shape (jax.jit), and keep each executable. `predict` called in a loop on inputs of changing size
compiles on every call; the rule names the call and the shapes, with Keras's advice (fixed shapes).
TensorFlow's tf.function retracing (reduce_retracing=True in Keras) is not diagnosed here.

Multi-process runs: the collective the backend offers for the processes to agree on a stop (`collective`:
jax.distributed's, torch.distributed's), and whether the environment says there are several processes
when there is none (`launched_processes`).
"""

from __future__ import annotations

import math
import os
import re
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from leakdoctor._base.evidence import Evidence, Rule
from leakdoctor._base.findings import Finding
from leakdoctor._base.messages import Record, msg
from leakdoctor._base.integration import Integration
from leakdoctor._base.metric import FunctionProbe, MetricSpec
from leakdoctor._base.source import caller_frame, is_user_file, user_site
from leakdoctor.integrations._holders import Holder, find_holders

ALIVE = "keras_models_alive"
SEEN = "keras_models_seen"
SIZE = "keras_model_bytes"
RSS = "rss_bytes"
COMPILES = "jax_compiles"
#: Keras's jitted step functions (keras/src/backend/jax/trainer.py), by the call that compiles them.
STEP_FUNCTIONS = {"train_step": "fit", "test_step": "evaluate", "predict_step": "predict"}


def require() -> Any:
    """The keras module (Keras 3), or an ImportError that says how to install it."""
    try:
        import keras
    except ImportError as err:
        raise ImportError("leakdoctor's Keras support needs Keras 3: pip install leakdoctor[keras]") from err
    if not hasattr(keras, "config") or not hasattr(keras.config, "backend"):
        raise ImportError(f"leakdoctor's Keras support needs Keras 3, found keras {keras.__version__}: "
                          f"pip install 'leakdoctor[keras]'")
    return keras


def backend() -> str:
    """The Keras backend in use: "jax", "torch", "tensorflow" or "numpy"."""
    return str(require().config.backend())


# --- multi-process runs ---------------------------------------------------------------------------

#: What launchers set in every process of a multi-process run: how many there are (torchrun, Lightning
#: and Ray Train set WORLD_SIZE; keras.distribution.initialize reads KERAS_DISTRIBUTION_NUM_PROCESSES).
PROCESS_COUNT_VARIABLES = ("WORLD_SIZE", "KERAS_DISTRIBUTION_NUM_PROCESSES")


def collective() -> tuple[int, Callable[[list[int]], list[int]]] | None:
    """In a multi-process run of Keras's backend: this process's rank, and how the processes agree on a
    stop (stopping.Agree, the element-wise maximum of a few integers over the processes): on jax, with
    jax.distributed initialized and more than one process, a process_allgather; on torch, with
    torch.distributed initialized and more than one rank, an all_reduce. None otherwise (one process, or
    processes with no collective initialized: see launched_processes)."""
    name = backend()
    if name == "jax":
        import jax

        from leakdoctor.integrations import _jax as jax_integration

        # is_initialized first: jax.process_count() before jax.distributed.initialize would start the
        # backend, and the user's initialize would then fail
        if getattr(jax.distributed, "is_initialized", lambda: True)() and jax_integration.process_count() > 1:
            return int(jax.process_index()), jax_integration.process_maximum
    elif name == "torch":
        from leakdoctor.integrations import _torch as torch_integration

        rank = torch_integration.distributed_rank()
        if rank is not None and torch_integration.world_size() > 1:
            return rank, torch_integration.rank_maximum
    return None


def launched_processes() -> str | None:
    """The launcher's variable that says this process is one of several ("WORLD_SIZE=2"), else None."""
    for name in PROCESS_COUNT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 1:
            return f"{name}={value}"
    return None


# --- the calls: which models, from where ------------------------------------------------------------

class Calls:
    """What the callback reports about each top-level fit/evaluate/predict call: its kind, the user's
    line that made it, and its model. Models are held weakly: `alive` counts those not yet freed;
    `model_bytes` is what the latest model's variables and optimizer state hold."""

    def __init__(self) -> None:
        self._models: weakref.WeakSet[Any] = weakref.WeakSet()
        self._latest: Callable[[], Any] = lambda: None
        self.seen = 0
        self.model_bytes = 0.0
        self.kind: str | None = None
        self.site: str | None = None

    def begin(self, kind: str, model: Any, site: str | None) -> None:
        self.kind, self.site = kind, site
        if model is not None and model not in self._models:
            self._models.add(model)
            self.seen += 1
        if model is not None:
            self._latest = weakref.ref(model)

    def end(self, model: Any) -> None:
        if model is not None:
            self.model_bytes = variables_bytes(model)

    @property
    def alive(self) -> int:
        return len(self._models)

    def older(self) -> list[Any]:
        """The models still in memory other than the latest call's: those a sweep kept (in a list, a dict,
        the History objects that fit() returns), whose holder the models rule names."""
        latest = self._latest()
        return [model for model in list(self._models) if model is not latest]

    def probe(self) -> FunctionProbe:
        """Models this callback worked with: how many, how many are still in memory, and their size."""
        specs = {ALIVE: MetricSpec(ALIVE, "count", source="keras", where="models not yet freed"),
                 SEEN: MetricSpec(SEEN, "count", role="supporting", source="keras", where="models used"),
                 SIZE: MetricSpec(SIZE, "bytes", role="supporting", source="keras", where="the latest model")}
        return FunctionProbe("keras_models", lambda: {ALIVE: float(self.alive), SEEN: float(self.seen),
                                                      SIZE: self.model_bytes}, specs)


def is_users(model: Any) -> bool:
    """Is the model's class the user's own (a subclassed keras.Model), not one of Keras's?"""
    module = sys.modules.get(type(model).__module__) if model is not None else None
    return is_user_file(getattr(module, "__file__", None) or "<unknown>")


def variables_bytes(model: Any) -> float:
    """Bytes of a model's variables and of its optimizer's (Adam keeps two per weight)."""
    optimizer = getattr(model, "optimizer", None)
    variables = list(getattr(model, "weights", [])) + list(getattr(optimizer, "variables", None) or [])
    total = 0
    for v in variables:
        bits = re.search(r"\d+", str(v.dtype))
        total += math.prod(v.shape) * (int(bits.group()) // 8 if bits else 1)
    return float(total)


def caller_site() -> str | None:
    """Where the user's code called into Keras (fit, evaluate, predict) that is calling us now."""
    return user_site(sys._getframe(1))


# --- TensorFlow's GPU memory --------------------------------------------------------------------------

def tensorflow_gpu_probe() -> FunctionProbe | None:
    """Bytes TensorFlow's allocator holds on each GPU (tf.config.experimental.get_memory_info), and the
    peak; None without a GPU. TensorFlow is imported only here, when the backend is tensorflow."""
    import tensorflow as tf

    devices = [d.name.split("device:")[-1] for d in tf.config.list_logical_devices("GPU")]
    if not devices:
        return None
    specs: dict[str, MetricSpec] = {}
    for device in devices:
        tag = device.lower().replace(":", "")
        specs[f"tf_{tag}_bytes"] = MetricSpec(f"tf_{tag}_bytes", "bytes", source="tensorflow", where=device)
        specs[f"tf_{tag}_peak_bytes"] = MetricSpec(f"tf_{tag}_peak_bytes", "bytes", role="supporting",
                                                   source="tensorflow", where=device)

    def read() -> Mapping[str, float]:
        values = {}
        for device in devices:
            info = tf.config.experimental.get_memory_info(device)
            tag = device.lower().replace(":", "")
            values[f"tf_{tag}_bytes"], values[f"tf_{tag}_peak_bytes"] = float(info["current"]), float(info["peak"])
        return values

    return FunctionProbe("tensorflow_gpu", read, specs)


def backend_integrations(model: Any = None) -> list[Integration]:
    """What the backend contributes: the JAX integration (live arrays, compiles), the torch one (device
    memory, tensor census; on the torch backend a Keras model is a torch.nn.Module, so its hooks are
    counted and its attributes searched for kept tensors), TensorFlow's GPU memory; nothing for numpy."""
    name = backend()
    if name == "jax":
        from leakdoctor.integrations import _jax as jax_integration

        return [jax_integration.integration()]
    if name == "torch":
        import torch

        from leakdoctor.integrations import _torch as torch_integration

        return [torch_integration.integration(model=model if isinstance(model, torch.nn.Module) else None)]
    if name == "tensorflow":
        probe = tensorflow_gpu_probe()
        return [Integration("tensorflow", probes=[probe])] if probe else []
    return []


# --- rules ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NewModels:
    """A finding's subject when models built in a loop make memory grow: what clear_session acts on."""

    models: int  # new models in the window
    calls: int  # calls in the window
    freed: int  # most old models one gc.collect() of the window found still in memory
    survived: int  # models alive after the last gc.collect(), more than at the start: still referenced
    model_bytes: float  # what one of the window's models holds, on average (variables and optimizer state)
    growth_per_model: float  # how much memory grew per new model

    @property
    def piling(self) -> bool:
        """Memory grows by at least half a model per new model: the old ones (or what they hold) stay.
        Less is the C heap settling around models that come and go, not the models."""
        return self.growth_per_model >= 0.5 * self.model_bytes

    @property
    def piling_rate(self) -> float:
        """Growth per call from which the models pile up (half a model per new model), at this window's
        share of calls that brought a new model."""
        return 0.5 * self.model_bytes * self.models / max(1, self.calls)

    @property
    def referenced(self) -> bool:
        return self.survived >= max(1, self.models / 2)


def _reading(ladder: Any, metric: str, when: str) -> float:
    value = ladder.before(metric) if when == "before" else ladder.after(metric)
    return 0.0 if value is None else value


def model_turnover(ev: Evidence, metric: str = RSS) -> NewModels:
    """How the window's models fared: new ones, how many old ones a collection found, how many are
    still alive after the last one (still referenced), and how much `metric` grew in the window per new
    model."""
    new = _reading(ev.end, SEEN, "after") - _reading(ev.begin, SEEN, "before")
    freed = max(_reading(ladder, ALIVE, "before") - _reading(ladder, ALIVE, "after")
                for ladder in (ev.middle, ev.end) if ladder is not None)
    survived = _reading(ev.end, ALIVE, "after") - _reading(ev.begin, ALIVE, "after")
    # the window's models may differ in size (a sweep over widths): their growth is weighed against the
    # mean of the sizes the ladders saw, not the last model's alone
    sizes = [size for ladder in (ev.begin, ev.middle, ev.end)
             if ladder is not None and (size := ladder.before(SIZE))]
    model_bytes = sum(sizes) / len(sizes) if sizes else 0.0
    # what the window's own models left: its growth over the models it made (the suspicion's rate, taken
    # over windows that may have seen other calls, moves a borderline pile from one side to the other);
    # on the count of models alive, what the models that piled up hold
    grown = ev.growth(metric) * (model_bytes if metric == ALIVE else 1.0)
    per_model = grown / new if new else 0.0
    return NewModels(int(new), ev.steps, int(freed), int(survived), model_bytes, per_model)


def _memory(ev: Evidence, accepted: list[Finding]) -> list[str]:
    """Memory metrics that nothing explains yet and that grew: kept after the cleanup ladder, or taken
    back by gc.collect() (garbage in reference cycles); resident memory first. Growth that only
    malloc_trim took back is the C allocator's cache, left to the allocator_cache rule, unless the
    window's ladders found old models waiting for a collection: then Python's own full collection had
    freed the pile just before the last ladder (which one of the two gets there first is chance: on the
    jax backend 1 run in 3), and what malloc_trim took back is what the C heap kept of those models."""
    rungs = {"gc_collect"} | (set(ev.end.settle) if model_turnover(ev).freed else set())
    grown = [m for m in ev.unexplained(accepted) if ev.specs[m].unit == "bytes"
             and (ev.survives(m) or ev.reclaimed_by(m) in rungs)]
    return sorted(grown, key=lambda m: m != RSS)


def _models_pile(ev: Evidence, accepted: list[Finding]) -> list[str]:
    """Where no memory metric grew through the ladders. When the old models are still referenced after the
    ladder's gc.collect(): resident memory that grew in the window (what the C heap cached around them may
    have been taken back by malloc_trim: a sweep's fits move tens of MiB through the heap, more than a kept
    model holds, but each model kept holds its variables and optimizer state for good), else the count of
    models alive where that raised the suspicion (an exact count shows the pile before resident memory's
    noise does). When the ladder's collection freed them: the count of models alive, where it raised the
    suspicion, since Python's own full collections did not (keras#2102: on a large heap they come too
    seldom for models in reference cycles). [RSS], [ALIVE] or none."""
    unexplained = ev.unexplained(accepted)
    if model_turnover(ev).referenced:
        return [RSS] if RSS in unexplained else [ALIVE] if ALIVE in unexplained else []
    return [ALIVE] if ALIVE in unexplained and ev.reclaimed_by(ALIVE) == "gc_collect" else []


def _kept(ev: Evidence, metric: str) -> bool:
    """Did the metric keep its growth through the ladders, more than resident memory refaulting the pages
    that the ladder's own malloc_trim gave back? With models that come and go, the next fits' allocations
    land in those pages again (a loop never trimmed stays level). Keras's backends take host memory from
    malloc, so what a model leaves behind natively shows in malloc's bytes in use; the mapped size, which
    Evidence.refilled also asks, moves by the 1 MiB arenas that Python maps for small objects and leaves
    mostly untouched, more than the few hundred KiB a window of fits refaults."""
    return ev.survives(metric) and not (metric == RSS and ev.malloc_kept(metric) is False)


def _census(ev: Evidence) -> Record | None:
    census = ev.reports.get("gc_census")
    return msg("objects_growing", types=[{"type": t, "gained": n} for t, n in census.rows[:3]]) \
        if census and census.rows else None


def models_rule(calls: Calls) -> Rule:
    """Memory that grows while every call brings a new model: the old models stay in memory."""

    def models_in_a_loop(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        new = model_turnover(ev).models
        if new < max(2, ev.steps // 2):
            return []
        compiles = (COMPILES,) if COMPILES in ev.unexplained(accepted) else ()
        alive = (ALIVE,) if ALIVE in ev.unexplained(accepted) else ()
        memory = _memory(ev, accepted)
        where = f"{calls.kind}() at {calls.site}" if calls.site else f"{calls.kind}()"
        models = msg("new_models", count=new, calls=ev.steps, where=where)
        if not memory:
            memory = _models_pile(ev, accepted)
        if not memory:
            return [ev.finding(
                "compile_cache", COMPILES, location=calls.site, explains=compiles, benign=True,
                evidence=msg("model_compiles", growth=ev.describe(COMPILES), models=models),
                recommendation=msg("reuse_model"))] if compiles else []
        metric = memory[0]
        turnover = model_turnover(ev, metric)
        explains = tuple(dict.fromkeys([*memory, *compiles, *alive]))
        size = msg("model_holds", size=turnover.model_bytes) if metric == ALIVE else \
            msg("per_new_model", growth=turnover.growth_per_model, size=turnover.model_bytes)
        also = [msg("also", growth=ev.describe(m)) for m in memory[1:]]
        if not (turnover.referenced or turnover.piling or _kept(ev, metric)):
            refault = msg("refaulted") if ev.survives(metric) else None
            return [ev.finding(  # its own place: a leak found at calls.site would be another finding
                "python_objects", metric, location=f"{where}, each model replacing the last", benign=True,
                explains=explains, evidence=msg("models_settle", growth=ev.describe(metric), also=also, models=models,
                                                size=size, refault=refault),
                recommendation=msg("models_freed"))]
        location = calls.site
        if turnover.referenced:
            holder = _models_holder(calls)
            held = msg("models_held_by", holder=holder.name) if holder else msg("models_held_unknown")
            cause = "python_objects"
            why = msg("models_referenced", count=turnover.survived, held=held)
            keep = msg("do_not_keep_models", holder=holder.path) if holder else None
            advice = msg("drop_old_models", keep=keep)
            location = holder.location(ev.reports.get("tracemalloc")) if holder else location
        elif turnover.piling:
            taken = msg("gc_took_back") if ev.reclaimed_by(metric) == "gc_collect" else msg("collected_then_trimmed")
            cause, why = "python_objects", (msg("models_in_cycles", taken=taken, count=turnover.freed)
                                            if not ev.survives(metric) else msg("not_given_back"))
            advice = msg("clear_session_or_del")
        else:
            cause, why = "native_memory", msg("models_freed_memory_grew")
            advice = msg("clear_session_caches")
        return [ev.finding(
            cause, metric, location=location, subject=turnover, explains=explains,
            evidence=msg("models_kept", growth=ev.describe(metric), also=also, models=models, size=size, why=why,
                         census=_census(ev)),
            recommendation=msg("clear_session_remedy", advice=advice))]

    return Rule(15, models_in_a_loop)


def _models_holder(calls: Calls) -> Holder | None:
    """Where the user's program keeps the old models (a list of a sweep, a global, a variable of the loop,
    an attribute of its objects), with the line that stores them; None where no such place holds them
    (only Keras's own objects do). Looked for from the user's code that called fit() outwards."""
    older = calls.older()
    holders = find_holders(older, [], caller_frame()) if older else []
    return holders[0] if holders else None


def retrace_rule(calls: Calls) -> Rule:
    """Keras's step functions compiled again and again for the same model: inputs of changing shape."""

    def keras_retracing(ev: Evidence, accepted: list[Finding]) -> list[Finding]:
        if COMPILES not in ev.unexplained(accepted) or model_turnover(ev).models:
            return []  # new models compile anew: the models rule's business
        activity = ev.reports.get("jax_compiles")
        steps = [s for s in STEP_FUNCTIONS if activity is not None and activity.compiled(s)]
        if not steps:
            return []
        kinds = sorted({STEP_FUNCTIONS[s] for s in steps})
        count = sum(n for name, (n, _) in activity.functions.items() if any(s in name for s in steps))
        repeated = activity.repeated_miss()
        reason = msg("jax_says", reason=repeated[0].reason) if repeated else None
        memory = _memory(ev, accepted)
        rss = [m for m in memory if m == RSS]
        metric = rss[0] if rss else COMPILES
        where = f"{calls.kind}() at {calls.site}" if calls.site else "/".join(f"{k}()" for k in kinds)
        memory_note = msg("executable_kept", growth=ev.describe(RSS)) if rss else None
        return [ev.finding(
            "compile_cache", metric, location=calls.site or where, explains=(COMPILES, *rss),
            evidence=msg("keras_compiled", growth=ev.describe(COMPILES), functions=steps, count=count,
                         steps=ev.steps, where=where, reason=reason, memory=memory_note),
            recommendation=msg("fixed_shapes", calls="/".join(k + "()" for k in kinds)))]

    return Rule(18, keras_retracing)


def integration(calls: Calls) -> Integration:
    """Keras's own part: the models probe and the Keras rules (the backend's part: backend_integrations)."""
    require()
    return Integration(name="keras", probes=[calls.probe()], rules=[models_rule(calls), retrace_rule(calls)],
                       targets={"keras_calls": calls})


__all__ = ["Calls", "NewModels", "backend", "backend_integrations", "caller_site", "collective", "integration",
           "launched_processes", "require", "tensorflow_gpu_probe", "user_site"]
