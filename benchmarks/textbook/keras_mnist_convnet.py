"""Keras's "Simple MNIST convnet" example: keras-team/keras-io, examples/vision/mnist_convnet.py, as a user
runs it (no leakdoctor code here), on Keras 3 with the backend KERAS_BACKEND names (jax or torch).

Kept from the original: images scaled to [0, 1] with a channel axis, the shape prints, one-hot labels; the
Sequential model (Conv2D 32 3x3 relu, MaxPooling2D 2x2, Conv2D 64 3x3 relu, MaxPooling2D 2x2, Flatten,
Dropout 0.5, Dense 10 softmax), `model.summary()`, categorical cross-entropy with Adam and the accuracy
metric, `fit(batch_size, epochs, validation_split=0.1)`, then `evaluate` on the test set and its prints.

Changed: MNIST (downloaded by keras.datasets) is replaced by synthetic images of the same shape and dtype
(_mnist.py); sizes shrunk to run in about a minute on one core: 3200 training images (60000), 1000 test
images (10000), batch 32 (128), 4 epochs (15). Two things users add, off by default (the original): with
--trials N, a small search over the dropout rate, N models each built after
`keras.backend.clear_session()`, compiled and fitted for one epoch, the best kept by validation accuracy;
with --requests M, after training, M `predict` calls on batches of 64 test images (a serving loop).

Lines ending in `# PLANT name: code` are where benchmarks/bench_textbook.py plants one textbook leak (it
runs a copy with that one line replaced by `code`); a `pass` there is inert in this clean script.
"""

import argparse

import _mnist
import keras
import numpy as np
from keras import layers

parser = argparse.ArgumentParser(description="Simple MNIST convnet")
parser.add_argument("--trials", type=int, default=1, help="models in the dropout search (1: the example's one fit)")
parser.add_argument("--requests", type=int, default=0, help="predict calls after training")
args = parser.parse_args()

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)

# Load the data and split it between train and test sets
x_train, y_train, x_test, y_test = _mnist.mnist(3200, 1000)

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


def build_model(dropout=0.5):
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(dropout),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )


batch_size = 32
epochs = 4

if args.trials <= 1:
    model = build_model()
    model.summary()
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)
else:
    models = []
    best, best_accuracy = None, -1.0
    for dropout in np.linspace(0.2, 0.6, args.trials):
        keras.backend.clear_session()
        model = build_model(float(dropout))
        model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
        history = model.fit(x_train, y_train, batch_size=batch_size, epochs=1, validation_split=0.1, verbose=2)
        pass  # PLANT keep_models: models.append(model)
        accuracy = history.history["val_accuracy"][-1]
        print(f"dropout {dropout:.2f}: val_accuracy {accuracy:.4f}")
        if accuracy > best_accuracy:
            best, best_accuracy = float(dropout), accuracy
    print(f"best dropout {best:.2f}")

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])

for i in range(args.requests):
    request = x_test[(64 * i) % 896: (64 * i) % 896 + 64]
    probs = model.predict(request, batch_size=64, verbose=0)  # PLANT predict_shapes: probs = model.predict(x_test[: i + 1], batch_size=i + 1, verbose=0)
    if i % 50 == 0:
        print(f"request {i}: predicted classes {np.argmax(probs, axis=1)[:8]}")
