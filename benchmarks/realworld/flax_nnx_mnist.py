"""Flax NNX's MNIST tutorial, reproduced: google/flax, docs_nnx/mnist_tutorial.md (.ipynb).

The author's script: an `nnx.Module` CNN (Conv 1->32 3x3, relu, avg_pool 2x2, Conv 32->64 3x3, relu,
avg_pool 2x2, Linear 3136->256, relu, Linear 256->10), `nnx.Optimizer` with `optax.adamw(0.005, 0.9)`,
an `nnx.MultiMetric` (Accuracy, Average('loss')), an `nnx.jit` train_step (`nnx.value_and_grad`,
in-place `metrics.update` and `optimizer.update`) and eval_step; 1200 training steps of batch 32 drawn
from a shuffled, repeated training set, and every 200 steps the training metrics are computed into a
history and reset, the test set is evaluated batch by batch, and both are printed.

Changed: MNIST (tensorflow_datasets, tf.data) is replaced by synthetic images of the same shape in [0, 1]
served as shuffled batches from numpy; sizes shrunk to run 1000+ steps in about a minute on CPU:
convolutions 8 and 16 wide and Linear 784->64 (32, 64, 3136->256), 4096 training images (60000) and 320
test images (10000), --steps steps (1200); `nnx.Optimizer` gets `wrt=nnx.Param` and `optimizer.update`
the model, as Flax 0.11+ requires; train_step returns its gradients (unused unless --leak); plots
and the inference cells left out.

Leak (--leak): the user keeps every step's gradients in a list to plot their norms after training
(`grad_history.append(grads)`): every step's gradient arrays stay alive on the device.
"""

from __future__ import annotations

import time
from functools import partial

import _common as common
import numpy as np
import optax
from flax import nnx

from leakdoctor.callbacks.flax import LeakDoctor  # leakdoctor

eval_every = 200
batch_size = 32
learning_rate = 0.005
momentum = 0.9


class CNN(nnx.Module):
    """A simple CNN model."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(784, 64, rngs=rngs)
        self.linear2 = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.linear1(x))
        x = self.linear2(x)
        return x


def loss_fn(model: CNN, batch):
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
    optimizer.update(model, grads)  # In-place updates.
    return grads


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
    loss, logits = loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.


def batches(images, labels, size, rng=None):
    """Batches of `size` (the incomplete one dropped), shuffled and repeated forever when `rng` is given."""
    while True:
        order = rng.permutation(len(images)) if rng is not None else np.arange(len(images))
        for start in range(0, len(order) - size + 1, size):
            ids = order[start:start + size]
            yield {"image": images[ids], "label": labels[ids]}
        if rng is None:
            return


def main() -> None:
    args = common.arguments(__doc__, steps=1000)
    train_steps = args.steps
    train_images, train_labels, test_images, test_labels = common.mnist(4096, 320)
    train_images = (train_images[..., None] / 255.0).astype(np.float32)
    test_images = (test_images[..., None] / 255.0).astype(np.float32)
    train_ds = batches(train_images, train_labels.astype(np.int32), batch_size, np.random.default_rng(0))

    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(learning_rate, momentum), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))

    metrics_history = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}
    grad_history = []
    began = time.perf_counter()
    with common.attach(LeakDoctor, args, optimizer=optimizer, model=model) as doctor:  # leakdoctor
        for step, batch in zip(range(train_steps), train_ds):
            grads = train_step(model, optimizer, metrics, batch)
            if args.leak:
                grad_history.append(grads)  # LEAK
            doctor.step()  # leakdoctor

            if step > 0 and (step % eval_every == 0 or step == train_steps - 1):  # One training epoch has passed.
                for metric, value in metrics.compute().items():  # Compute the metrics.
                    metrics_history[f"train_{metric}"].append(value)  # Record the metrics.
                metrics.reset()  # Reset the metrics for the test set.

                for test_batch in batches(test_images, test_labels.astype(np.int32), batch_size):
                    eval_step(model, metrics, test_batch)

                for metric, value in metrics.compute().items():
                    metrics_history[f"test_{metric}"].append(value)
                metrics.reset()  # Reset the metrics for the next training epoch.

                print(f"[train] step: {step}, loss: {metrics_history['train_loss'][-1]}, "
                      f"accuracy: {metrics_history['train_accuracy'][-1] * 100}")
                print(f"[test] step: {step}, loss: {metrics_history['test_loss'][-1]}, "
                      f"accuracy: {metrics_history['test_accuracy'][-1] * 100}")
    common.done(train_steps, time.perf_counter() - began)


if __name__ == "__main__":
    main()
