"""Keras models built and fitted in a loop without keras.backend.clear_session() (run by tests/test_run.py
under `leakdoctor run`, unedited; KERAS_BACKEND picks the backend)."""

import sys
import warnings

warnings.filterwarnings("ignore")

import keras  # noqa: E402
import numpy as np  # noqa: E402

fits = int(sys.argv[1]) if len(sys.argv) > 1 else 20
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 64)).astype("float32")
y = x[:, :1] * 0.5
for _ in range(fits):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)  # FIT-IN-LOOP
print(f"fitted {fits} models")
