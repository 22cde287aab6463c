"""MLX's MNIST example, reproduced: ml-explore/mlx-examples, mnist/main.py (the version before `mx.compile`
was added, commit 0ed2de6a: the loop evaluates `model.parameters()` and `optimizer.state` itself).

The author's script: an `MLP` (2 hidden layers of 32, relu as `mx.maximum(x, 0)`), mean cross-entropy,
`nn.value_and_grad`, SGD (lr 0.1), batches of 256 from a fresh permutation every epoch, and after each
step `mx.eval(model.parameters(), optimizer.state)`; after every epoch the test accuracy is computed and
printed with the epoch's time.

Changed: MNIST (downloaded by the example's mnist.py) is replaced by synthetic images of the same shape,
flattened to 784 floats in [0, 1]; all 60000 training images and 10000 test images are kept, in batches
of 32 (256), and training stops after --steps batches (10 epochs), so that 1000+ steps run in about a
minute on CPU: an epoch (1875 steps) is longer than the run, as on a dataset larger than MNIST; the CPU
device is the default (--gpu left out).

Leak (--leak): the `mx.eval(model.parameters(), optimizer.state)` line is dropped (mlx#1271, the MLX 0.16
DETR report): `optimizer.update` only records graph nodes, so every step's update is chained onto the
last one's until something reads the parameters, here the test accuracy at the epoch's end.
"""

from __future__ import annotations

import time

import _common as common
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from leakdoctor.callbacks.mlx import LeakDoctor  # leakdoctor


class MLP(nn.Module):
    """A simple MLP."""

    def __init__(self, num_layers: int, input_dim: int, hidden_dim: int, output_dim: int):
        super().__init__()
        layer_sizes = [input_dim] + [hidden_dim] * num_layers + [output_dim]
        self.layers = [nn.Linear(idim, odim) for idim, odim in zip(layer_sizes[:-1], layer_sizes[1:])]

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = mx.maximum(layer(x), 0.0)
        return self.layers[-1](x)


def loss_fn(model, X, y):
    return mx.mean(nn.losses.cross_entropy(model(X), y))


def eval_fn(model, X, y):
    return mx.mean(mx.argmax(model(X), axis=1) == y)


def batch_iterate(batch_size, X, y):
    perm = mx.array(np.random.permutation(y.size))
    for s in range(0, y.size, batch_size):
        ids = perm[s: s + batch_size]
        yield X[ids], y[ids]


def main(args):
    seed = 0
    num_layers = 2
    hidden_dim = 32
    num_classes = 10
    batch_size = 32
    learning_rate = 1e-1

    np.random.seed(seed)

    # The data: synthetic stand-ins for MNIST, flattened and scaled as the example's loader does.
    images, labels, test_images, test_labels = common.mnist(60000, 10000)
    train_images, train_labels, test_images, test_labels = map(
        mx.array, (images.reshape(-1, 784) / np.float32(255), labels.astype(np.uint32),
                   test_images.reshape(-1, 784) / np.float32(255), test_labels.astype(np.uint32)))
    steps_per_epoch = -(-train_labels.size // batch_size)
    num_epochs = -(-args.steps // steps_per_epoch)

    # Load the model
    model = MLP(num_layers, train_images.shape[-1], hidden_dim, num_classes)
    mx.eval(model.parameters())

    loss_and_grad_fn = nn.value_and_grad(model, loss_fn)
    optimizer = optim.SGD(learning_rate=learning_rate)

    step = 0
    began = time.perf_counter()
    with common.attach(LeakDoctor, args, model=model, optimizer=optimizer) as doctor:  # leakdoctor
        for e in range(num_epochs):
            tic = time.perf_counter()
            for X, y in batch_iterate(batch_size, train_images, train_labels):
                if step == args.steps:
                    break
                step += 1
                loss, grads = loss_and_grad_fn(model, X, y)
                optimizer.update(model, grads)  # LEAK
                if not args.leak:
                    mx.eval(model.parameters(), optimizer.state)
                doctor.step()  # leakdoctor
            accuracy = eval_fn(model, test_images, test_labels)
            toc = time.perf_counter()
            print(f"Epoch {e}: Test accuracy {accuracy.item():.3f}, Time {toc - tic:.3f} (s)")
    common.done(step, time.perf_counter() - began)


if __name__ == "__main__":
    mx.set_default_device(mx.cpu)
    main(common.arguments(__doc__, steps=1000))
