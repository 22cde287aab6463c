"""Keras `predict` called in a loop on inputs of a new size each time, on the JAX backend (a serving loop
fed requests of varying batch size): predict compiles its step function for every new input shape and
keeps every executable."""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _harness import Truth, marker  # noqa: E402

from leakdoctor.callbacks.keras import LeakDoctorCallback  # noqa: E402

TRUTH = Truth(
    leak=True, cause="compile_cache", framework="keras", steps=24, start=0, step="predict() call", warmup=3,
    check=2, settle=2, what="model.predict on a new input size every call (JAX backend retraces)",
    source="Keras docs on retracing", location=(marker(__file__, "PREDICT-IN-LOOP"),),
)


def run(h) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    rng = np.random.default_rng(0)
    for rows in range(1, h.length + 1):
        inputs = rng.normal(size=(rows, 32)).astype("float32")
        model.predict(inputs, batch_size=1024, verbose=0, callbacks=h.callbacks(LeakDoctorCallback))  # PREDICT-IN-LOOP
        h.tick()
