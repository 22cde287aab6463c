"""clear_session: `keras.backend.clear_session()` between fit/evaluate/predict calls, whenever a new model
came since the last clear, when models built in a loop make memory grow (keras#2102). Its full
gc.collect() frees the old models, which sit in reference cycles; malloc_trim then hands their memory back.

When it runs: at the end of a top-level call (the callback steps this doctor there), never inside one.
By then the call's work is done and its state is back in the model (Keras syncs it before
`on_*_end`); the same model keeps working afterwards. Before it, a model is being built or
compiled and global state may be half-made.

What it changes, hence remedies="all" only: Keras's global names restart ("dense", "dense_1", ... again),
so a new layer may share a name with a layer of an older live model (a problem only if both end up in
one model); the backend's caches are reset (TensorFlow's graph and kernel cache, torch.compile's
cache: recompiled on next use, same results). Everything else clear_session would reset on this thread is
put back: the dtype policy (mixed precision), the distribution, the global seed generator, config
settings, and any scope that is open (name scopes, custom-object scopes). Keras keeps that state per
thread and clear_session drops it for every thread: a program building Keras models in other threads at
the same time should not use this remedy.
"""

from __future__ import annotations

from typing import Any

from leakdoctor._base.messages import Record, msg
from leakdoctor._base.trend import Trend
from leakdoctor.integrations import _keras as keras_integration
from leakdoctor.integrations._process import malloc_trim
from leakdoctor.remedies._base import Remedy, RemedyContext

#: The only global state reset for good: the counters that make layer names unique.
RESET = frozenset({"object_name_uids"})


def clear_session() -> None:
    """keras.backend.clear_session(), keeping this thread's global state except the name counters."""
    keras = keras_integration.require()
    from keras.src.backend.common import global_state  # no public API lists the global state

    kept = {k: v for k, v in vars(global_state.GLOBAL_STATE_TRACKER).items() if k not in RESET}
    settings = dict(vars(global_state.GLOBAL_SETTINGS_TRACKER))
    keras.backend.clear_session(free_memory=True)
    for name, value in kept.items():
        global_state.set_global_attribute(name, value)
    for name, value in settings.items():
        setattr(global_state.GLOBAL_SETTINGS_TRACKER, name, value)


class ClearSession(Remedy):
    name = "clear_session"
    treats = frozenset({"python_objects", "native_memory"})
    safe = False

    def __init__(self) -> None:
        self._trim = malloc_trim()
        self._cleared_at = -1
        self._piling_rate = 0.0

    def applicable(self, ctx: RemedyContext) -> bool:
        return (super().applicable(ctx) and isinstance(ctx.finding.subject, keras_integration.NewModels)
                and isinstance(ctx.targets.get("keras_calls"), keras_integration.Calls))

    def apply(self, ctx: RemedyContext) -> Record:
        self._piling_rate = ctx.finding.subject.piling_rate
        self._clear(ctx.targets["keras_calls"])
        return msg("remedy_clear_session")

    def on_step(self, ctx: RemedyContext) -> None:
        calls = ctx.targets["keras_calls"]
        if calls.seen != self._cleared_at:
            self._clear(calls)

    def worked(self, rate_before: float, after: Trend) -> bool:
        """Effective when the models stop piling up: memory grows by less than half a model per new model,
        the line the diagnosis draws (what is left is the C heap settling around models that come and go,
        as in a loop that calls clear_session itself), or by at most a quarter of the rate before."""
        return after.slope < self._piling_rate or super().worked(rate_before, after)

    def _clear(self, calls: Any) -> None:
        clear_session()
        if self._trim is not None:
            self._trim()
        self._cleared_at = calls.seen


REMEDY = ClearSession
