"""Flax's (linen) MNIST example: google/flax, examples/mnist/train.py, as a user runs it (no leakdoctor
code here).

Kept from the original: the linen `CNN` (Conv 3x3, relu, avg_pool 2x2, Conv 3x3, relu, avg_pool 2x2,
Dense, relu, Dense 10), `create_train_state` (a `TrainState` with `optax.sgd(learning_rate, momentum)`), the
jitted `apply_model` (value_and_grad of the softmax cross-entropy; grads, loss and accuracy) and jitted
`update_model` (`state.apply_gradients`), `train_epoch` (a `jax.random.permutation` per epoch, the
incomplete batch skipped, every step's loss and accuracy kept and averaged at the epoch's end),
`train_and_evaluate` (after every epoch `apply_model` on the whole test set, the metrics logged).

Changed: MNIST (tensorflow_datasets) is replaced by synthetic images of the same shape in [0, 1]
(_mnist.py); sizes shrunk to run 1200 steps in about a minute on one core: batch 32 (128), convolutions 8
and 16 wide and Dense 64 (32, 64, 256), 9600 training images (60000) and 1000 test images (10000), 4 epochs
(10); the ml_collections config and TensorBoard writer are replaced by constants and logging; each batch
is standardised (mean 0.1307, std 0.3081) before the step, as many users add.

A line ending in `# PLANT name: code` is where benchmarks/bench_textbook.py plants one textbook leak (it
runs a copy with that one line replaced by `code`).
"""

import logging

import _mnist
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state

learning_rate = 0.1
momentum = 0.9
batch_size = 32
num_epochs = 4


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


def train_epoch(state, train_ds, batch_size, rng):
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
        batch_images = (batch_images - 0.1307) / 0.3081  # PLANT jit_lambda: batch_images = jax.jit(lambda x: (x - 0.1307) / 0.3081)(batch_images)
        grads, loss, accuracy = apply_model(state, batch_images, batch_labels)
        state = update_model(state, grads)
        epoch_loss.append(loss)
        epoch_accuracy.append(accuracy)
    train_loss = np.mean(epoch_loss)
    train_accuracy = np.mean(epoch_accuracy)
    return state, train_loss, train_accuracy


def get_datasets():
    """Load MNIST train and test datasets into memory (here: their synthetic stand-ins)."""
    train_images, train_labels, test_images, test_labels = _mnist.mnist(9600, 1000)
    train_ds = {"image": jnp.float32(train_images[..., None]) / 255.0, "label": jnp.asarray(train_labels)}
    test_ds = {"image": jnp.float32(test_images[..., None]) / 255.0, "label": jnp.asarray(test_labels)}
    return train_ds, test_ds


def create_train_state(rng):
    """Creates initial `TrainState`."""
    cnn = CNN()
    params = cnn.init(rng, jnp.ones([1, 28, 28, 1]))["params"]
    tx = optax.sgd(learning_rate, momentum)
    return train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=tx)


def train_and_evaluate() -> train_state.TrainState:
    """Execute model training and evaluation loop."""
    train_ds, test_ds = get_datasets()
    rng = jax.random.key(0)

    rng, init_rng = jax.random.split(rng)
    state = create_train_state(init_rng)

    for epoch in range(1, num_epochs + 1):
        rng, input_rng = jax.random.split(rng)
        state, train_loss, train_accuracy = train_epoch(state, train_ds, batch_size, input_rng)
        _, test_loss, test_accuracy = apply_model(state, (test_ds["image"] - 0.1307) / 0.3081, test_ds["label"])

        logging.info(
            "epoch:% 3d, train_loss: %.4f, train_accuracy: %.2f, test_loss: %.4f, test_accuracy: %.2f"
            % (epoch, train_loss, train_accuracy * 100, test_loss, test_accuracy * 100)
        )
    return state


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    train_and_evaluate()
