"""Benign: the same hyperparameter loop as keras_models_loop.py done right, with
`keras.backend.clear_session()` before each new model. Memory rises over the first models (allocator
arenas, the backend's caches) and then holds."""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _harness import Truth  # noqa: E402

from leakdoctor.callbacks.keras import LeakDoctorCallback  # noqa: E402

TRUTH = Truth(
    leak=False, cause=None, framework="keras", steps=24, start=0, step="fit() call", warmup=3, check=2, settle=2,
    what="a new model per loop iteration, keras.backend.clear_session() before each", source="keras#2102's fix",
)


def run(h) -> None:
    torch.set_num_threads(1)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 64)).astype("float32")
    y = (x[:, :1] * 0.5 + 0.1 * rng.normal(size=(256, 1))).astype("float32")
    for units in np.tile([128, 192, 256], h.length)[: h.length]:
        keras.backend.clear_session()
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(int(units), activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=h.callbacks(LeakDoctorCallback))
        h.tick()
