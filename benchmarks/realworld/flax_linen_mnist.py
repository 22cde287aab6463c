"""Flax's (linen) MNIST example, reproduced: google/flax, examples/mnist/train.py.

The author's script: a linen `CNN` (Conv 32 3x3, relu, avg_pool 2x2, Conv 64 3x3, relu, avg_pool 2x2,
Dense 256, relu, Dense 10), a `TrainState` with `optax.sgd(learning_rate=0.1, momentum=0.9)`, a jitted
`apply_model` (value_and_grad of the softmax cross-entropy, returns grads, loss and accuracy) and a
jitted `update_model` (`state.apply_gradients`); `train_epoch` shuffles with `jax.random.permutation`,
drops the incomplete batch, keeps every step's loss and accuracy in lists and averages them at the epoch's
end; after every epoch `apply_model` runs on the whole test set and the metrics are logged.

Changed: MNIST (tensorflow_datasets) is replaced by synthetic images of the same shape in [0, 1]; sizes
shrunk to run 1000+ steps in about a minute on CPU: batch 32 (128), convolutions 8 and 16 wide and
Dense 64 (32, 64, 256), 4 epochs (10), the training images derived from --steps, 1000 test images
(10000); ml_collections config and the TensorBoard summary writer replaced by plain values and logging.

Leak (--leak): the user switches the optimizer to RAdam as optax wrote it up to 0.2.2 (optax#969;
leakdoctor/examples/old_radam.py) and applies the gradients outside jit, `state.apply_gradients(...)` in
the loop rather than the jitted `update_model`: the optimizer's `lax.cond` over closures is traced and
compiled again on every step and every executable is kept (jax#12719).
"""

from __future__ import annotations

import logging
import time

import _common as common
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state

from leakdoctor.callbacks.flax import LeakDoctor  # leakdoctor
from leakdoctor.examples.old_radam import old_radam

LEARNING_RATE = 0.1
MOMENTUM = 0.9
BATCH_SIZE = 32
NUM_EPOCHS = 4


class CNN(nn.Module):
    """A simple CNN model."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=8, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=16, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten
        x = nn.Dense(features=64)(x)
        x = nn.relu(x)
        x = nn.Dense(features=10)(x)
        return x


@jax.jit
def apply_model(state, images, labels):
    """Computes gradients, loss and accuracy for a single batch."""

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, images)
        one_hot = jax.nn.one_hot(labels, 10)
        loss = jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot))
        return loss, logits

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(state.params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return grads, loss, accuracy


@jax.jit
def update_model(state, grads):
    return state.apply_gradients(grads=grads)


def train_epoch(state, train_ds, batch_size, rng, doctor, leak):
    """Train for a single epoch."""
    train_ds_size = len(train_ds["image"])
    steps_per_epoch = train_ds_size // batch_size

    perms = jax.random.permutation(rng, len(train_ds["image"]))
    perms = perms[: steps_per_epoch * batch_size]  # skip incomplete batch
    perms = perms.reshape((steps_per_epoch, batch_size))

    epoch_loss = []
    epoch_accuracy = []

    for perm in perms:
        batch_images = train_ds["image"][perm, ...]
        batch_labels = train_ds["label"][perm, ...]
        grads, loss, accuracy = apply_model(state, batch_images, batch_labels)
        if leak:
            state = state.apply_gradients(grads=grads)  # LEAK
        else:
            state = update_model(state, grads)
        epoch_loss.append(loss)
        epoch_accuracy.append(accuracy)
        state = doctor.step(state)  # leakdoctor
    train_loss = np.mean(epoch_loss)
    train_accuracy = np.mean(epoch_accuracy)
    return state, train_loss, train_accuracy


def get_datasets(train_size):
    """Synthetic stand-ins for the MNIST train and test sets, in memory."""
    train_images, train_labels, test_images, test_labels = common.mnist(train_size, 1000)
    train_ds = {"image": jnp.float32(train_images[..., None]) / 255.0, "label": jnp.asarray(train_labels)}
    test_ds = {"image": jnp.float32(test_images[..., None]) / 255.0, "label": jnp.asarray(test_labels)}
    return train_ds, test_ds


def create_train_state(rng, leak):
    """Creates initial `TrainState`."""
    cnn = CNN()
    params = cnn.init(rng, jnp.ones([1, 28, 28, 1]))["params"]
    tx = old_radam(1e-3) if leak else optax.sgd(LEARNING_RATE, MOMENTUM)  # LEAK
    return train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=tx)


def train_and_evaluate(args):
    """Execute model training and evaluation loop."""
    train_ds, test_ds = get_datasets(BATCH_SIZE * -(-args.steps // NUM_EPOCHS))
    rng = jax.random.PRNGKey(0)

    rng, init_rng = jax.random.split(rng)
    state = create_train_state(init_rng, args.leak)

    with common.attach(LeakDoctor, args) as doctor:  # leakdoctor
        for epoch in range(1, NUM_EPOCHS + 1):
            rng, input_rng = jax.random.split(rng)
            state, train_loss, train_accuracy = train_epoch(state, train_ds, BATCH_SIZE, input_rng, doctor, args.leak)
            _, test_loss, test_accuracy = apply_model(state, test_ds["image"], test_ds["label"])

            logging.info(
                "epoch:% 3d, train_loss: %.4f, train_accuracy: %.2f, test_loss: %.4f, test_accuracy: %.2f"
                % (epoch, train_loss, train_accuracy * 100, test_loss, test_accuracy * 100))
    return state


def main() -> None:
    args = common.arguments(__doc__, steps=1200)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    began = time.perf_counter()
    state = train_and_evaluate(args)
    common.done(int(state.step), time.perf_counter() - began)


if __name__ == "__main__":
    main()
