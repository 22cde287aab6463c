"""Flax NNX's MNIST tutorial: google/flax, docs_nnx/mnist_tutorial.md (.ipynb), as a user runs it (no
leakdoctor code here).

Kept from the tutorial: the `nnx.Module` CNN (Conv 3x3, relu, avg_pool 2x2, Conv 3x3, relu, avg_pool 2x2,
Linear, relu, Linear 10), `nnx.Optimizer` with `optax.adamw(learning_rate, momentum)`, an `nnx.MultiMetric`
(Accuracy, Average('loss')), the `nnx.jit` `train_step` (`nnx.value_and_grad`, in-place `metrics.update` and
`optimizer.update`) and `eval_step`; training batches of 32 from a shuffled, repeated training set; every
`eval_every` steps the training metrics are computed into `metrics_history` and reset, the test set is
evaluated batch by batch, and both are printed.

Changed: MNIST (tensorflow_datasets, tf.data) is replaced by synthetic images of the same shape in [0, 1]
(_mnist.py) served as shuffled batches from numpy; sizes shrunk to run 1000 steps in under a minute on one
core: convolutions 8 and 16 wide and Linear 784->64 (32, 64, 3136->256), 4096 training images (60000), 320
test images (10000), 1000 steps (1200); `nnx.Optimizer` gets `wrt=nnx.Param` and `optimizer.update` the
model, as Flax 0.11+ requires; the plots and the inference cells are left out.

A line ending in `# PLANT name: code` is where benchmarks/bench_textbook.py plants one textbook leak (it
runs a copy with that one line replaced by `code`); the `pass` there is inert in this clean script and
`SNAPSHOTS` stays empty.
"""

from functools import partial

import _mnist
import numpy as np
import optax
from flax import nnx

train_steps = 1000
eval_every = 200
batch_size = 32
learning_rate = 0.005
momentum = 0.9

#: The weights by step (to average or pick from later): filled only by the state_cache plant.
SNAPSHOTS = {}


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


train_images, train_labels, test_images, test_labels = _mnist.mnist(4096, 320)
train_images = (train_images[..., None] / 255.0).astype(np.float32)
test_images = (test_images[..., None] / 255.0).astype(np.float32)
train_ds = batches(train_images, train_labels.astype(np.int32), batch_size, np.random.default_rng(0))

model = CNN(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(learning_rate, momentum), wrt=nnx.Param)
metrics = nnx.MultiMetric(
    accuracy=nnx.metrics.Accuracy(),
    loss=nnx.metrics.Average("loss"),
)

metrics_history = {
    "train_loss": [],
    "train_accuracy": [],
    "test_loss": [],
    "test_accuracy": [],
}

for step, batch in zip(range(train_steps), train_ds):
    # Run the optimization for one step and make a stateful update to the following:
    # - The train state's model parameters
    # - The optimizer state
    # - The training loss and accuracy batch metrics
    train_step(model, optimizer, metrics, batch)
    pass  # PLANT state_cache: SNAPSHOTS[step] = nnx.state(model, nnx.Param).to_pure_dict()

    if step > 0 and (step % eval_every == 0 or step == train_steps - 1):  # One training epoch has passed.
        # Log the training metrics.
        for metric, value in metrics.compute().items():  # Compute the metrics.
            metrics_history[f"train_{metric}"].append(value)  # Record the metrics.
        metrics.reset()  # Reset the metrics for the test set.

        # Compute the metrics on the test set after each training epoch.
        for test_batch in batches(test_images, test_labels.astype(np.int32), batch_size):
            eval_step(model, metrics, test_batch)

        # Log the test metrics.
        for metric, value in metrics.compute().items():
            metrics_history[f"test_{metric}"].append(value)
        metrics.reset()  # Reset the metrics for the next training epoch.

        print(
            f"[train] step: {step}, "
            f"loss: {metrics_history['train_loss'][-1]}, "
            f"accuracy: {metrics_history['train_accuracy'][-1] * 100}"
        )
        print(
            f"[test] step: {step}, "
            f"loss: {metrics_history['test_loss'][-1]}, "
            f"accuracy: {metrics_history['test_accuracy'][-1] * 100}"
        )
