"""Keras models built and fitted in a loop without `keras.backend.clear_session()` (keras#2102), e.g. a
hyperparameter search: every model sits in reference cycles, which only a full garbage collection frees,
and Python runs one rarely on a heap this large, so every old model stays in memory with its weights and
optimizer state. Torch backend; one LeakDoctorCallback reused across the fits (its steps are calls)."""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _harness import Truth, marker  # noqa: E402

from leakdoctor.callbacks.keras import LeakDoctorCallback  # noqa: E402

TRUTH = Truth(
    leak=True, cause="python_objects", framework="keras", remedy="clear_session", steps=40, start=0,
    what="a new Sequential model built, compiled and fitted per loop iteration, no clear_session",
    source="keras#2102", location=(marker(__file__, "FIT-IN-LOOP"),), step="fit() call", warmup=3, check=2, settle=2,
)


def run(h) -> None:
    torch.set_num_threads(1)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 64)).astype("float32")
    y = (x[:, :1] * 0.5 + 0.1 * rng.normal(size=(256, 1))).astype("float32")
    for units in np.tile([128, 192, 256], h.length)[: h.length]:
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(int(units), activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=h.callbacks(LeakDoctorCallback))  # FIT-IN-LOOP
        h.tick()
