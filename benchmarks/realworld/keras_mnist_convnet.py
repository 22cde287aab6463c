"""Keras's "Simple MNIST convnet" example, reproduced: keras-team/keras-io, examples/vision/mnist_convnet.py,
on Keras 3 with the jax or the torch backend (--backend; KERAS_BACKEND is set before keras is imported).

The author's script: images scaled to [0, 1] with a channel axis, labels one-hot; a Sequential model (Conv2D
32 3x3 relu, MaxPooling2D 2x2, Conv2D 64 3x3 relu, MaxPooling2D 2x2, Flatten, Dropout 0.5, Dense 10
softmax), `model.summary()`, categorical cross-entropy with Adam and the accuracy metric, one
`fit(batch_size=128, epochs=15, validation_split=0.1)`, then `evaluate` on the test set.

Changed: MNIST (downloaded by keras.datasets) is replaced by synthetic images of the same shape and
dtype; sizes shrunk to run 1000+ steps in about a minute on CPU: batch 32 (128), 4 epochs (15), the
training images derived from --steps (a tenth more for validation_split), 1000 test images (10000).

Leak (--leak), one per backend, each of a kind Keras users report, in one fit of one epoch over the same
total of training steps:
- jax: a callback keeps a copy of the weights after every batch, to plot later how they move
  (`model.get_weights()`: 136 KiB of numpy arrays a batch). (A search that builds a new model per trial
  without `keras.backend.clear_session()`, keras#2102, was the planted leak until measured: on Keras 3's
  jax backend the old models are freed by the garbage collector, and resident memory after 60 trials
  grows no faster without clear_session than with it.)
- torch: a callback keeps the model's predictions on a probe batch after every batch, to plot later how
  they evolve; on the torch backend each prediction keeps its autograd graph: memory grows with every
  batch.
"""

from __future__ import annotations

import math
import os
import time

import _common as common


def options(parser) -> None:
    parser.add_argument("--backend", choices=("jax", "torch"), default="jax")


args = common.arguments(__doc__, steps=1000, extra=options)
os.environ["KERAS_BACKEND"] = args.backend

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

from leakdoctor.callbacks.keras import LeakDoctorCallback  # noqa: E402  # leakdoctor

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)
batch_size = 32
epochs = 4
if args.leak:
    epochs = 1
steps_per_fit = -(-args.steps // epochs)

# The data, split between train and test sets
x_train, y_train, x_test, y_test = common.mnist(math.ceil(batch_size * steps_per_fit / 0.9), 1000)

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")

# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)


def build_model() -> keras.Sequential:
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )


class PredictionLogger(keras.callbacks.Callback):
    """Keeps the model's predictions on a few images after every batch, for a plot at the end."""

    def __init__(self, probe: np.ndarray) -> None:
        super().__init__()
        self.probe = probe
        self.predictions = []

    def on_train_batch_end(self, batch, logs=None):
        self.predictions.append(self.model(self.probe))  # LEAK


class WeightHistory(keras.callbacks.Callback):
    """Keeps a copy of the weights after every batch, for a plot at the end of how they moved."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(self.model.get_weights())  # LEAK


doctors = common.callbacks(LeakDoctorCallback, args)  # leakdoctor
planted = {"jax": WeightHistory, "torch": lambda: PredictionLogger(x_test[:64])}[args.backend]
callbacks = doctors + ([planted()] if args.leak else [])
began = time.perf_counter()
model = build_model()
model.summary()
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1, callbacks=callbacks)
seconds = time.perf_counter() - began

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
for doctor in doctors:
    doctor.finish()  # leakdoctor
common.done(epochs * steps_per_fit, seconds)
