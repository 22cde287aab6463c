"""A Keras fit with the LeakDoctorCallback, to be stopped by SIGTERM mid-fit (tests/test_sigterm.py).
`sigterm_keras.py FOLDER`: prints "ready" from the second epoch on; writes FOLDER/leaks.json."""

import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from leakdoctor.callbacks.keras import LeakDoctorCallback  # noqa: E402


class Ready(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            print("ready", flush=True)


x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
doctor = LeakDoctorCallback(summary_path=Path(sys.argv[1]) / "leaks.json")
model.fit(x, x[:, :1], epochs=100000, batch_size=32, verbose=0, callbacks=[doctor, Ready()])
