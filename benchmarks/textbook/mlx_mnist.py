"""MLX's MNIST example: ml-explore/mlx-examples, mnist/main.py, in its compiled form, as a user runs it (no
leakdoctor code here).

Kept from the original: the `MLP` (2 hidden layers of 32, relu), the mean cross-entropy `loss_fn`,
`batch_iterate` (a fresh permutation every epoch), `nn.value_and_grad`, SGD (lr 0.1), the compiled step
`@partial(mx.compile, inputs=state, outputs=state) def step(X, y)` over `state = [model.state,
optimizer.state]` followed by `mx.eval(state)` after every call, the compiled `eval_fn` over
`model.state`, and after every epoch the test accuracy printed with the epoch's time; CPU by default
(--gpu for the Metal back-end).

Changed: MNIST (downloaded by the example's mnist.py) is replaced by synthetic images of the same shape,
flattened to 784 floats in [0, 1] with uint32 labels (_mnist.py); sizes changed so that 1200 steps run in
seconds on one core: batch 32 (256), 38400 training images (60000; --train-size), 2000 test images (10000),
1 epoch (10; --epochs); --dataset left out. The loop keeps the loss `step` returns (printed at the end) and
has a `train_accuracy` list, as users add, left empty here.

Lines ending in `# PLANT name: code` are where benchmarks/bench_textbook.py plants one textbook leak (it
runs a copy with that one line replaced by `code`); the `pass` there is inert in this clean script.
"""

import argparse
import time
from functools import partial

import _mnist
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np


class MLP(nn.Module):
    """A simple MLP."""

    def __init__(
        self, num_layers: int, input_dim: int, hidden_dim: int, output_dim: int
    ):
        super().__init__()
        layer_sizes = [input_dim] + [hidden_dim] * num_layers + [output_dim]
        self.layers = [
            nn.Linear(idim, odim)
            for idim, odim in zip(layer_sizes[:-1], layer_sizes[1:])
        ]

    def __call__(self, x):
        for l in self.layers[:-1]:
            x = nn.relu(l(x))
        return self.layers[-1](x)


def loss_fn(model, X, y):
    return nn.losses.cross_entropy(model(X), y, reduction="mean")


def batch_iterate(batch_size, X, y):
    perm = mx.array(np.random.permutation(y.size))
    for s in range(0, y.size, batch_size):
        ids = perm[s : s + batch_size]  # PLANT compile_shapes: ids = perm[: s + batch_size]
        yield X[ids], y[ids]


def main(args):
    seed = 0
    num_layers = 2
    hidden_dim = 32
    num_classes = 10
    batch_size = 32
    num_epochs = args.epochs
    learning_rate = 1e-1

    np.random.seed(seed)

    # Load the data (synthetic stand-ins, flattened and scaled as the example's mnist.py does)
    images, labels, test_images, test_labels = _mnist.mnist(args.train_size, 2000)
    train_images, train_labels, test_images, test_labels = map(
        mx.array,
        (images.reshape(-1, 784).astype(np.float32) / 255, labels.astype(np.uint32),
         test_images.reshape(-1, 784).astype(np.float32) / 255, test_labels.astype(np.uint32)),
    )

    # Load the model
    model = MLP(num_layers, train_images.shape[-1], hidden_dim, num_classes)
    mx.eval(model.parameters())

    optimizer = optim.SGD(learning_rate=learning_rate)
    loss_and_grad_fn = nn.value_and_grad(model, loss_fn)

    # The state that will be captured as input and output
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(X, y):
        loss, grads = loss_and_grad_fn(model, X, y)
        optimizer.update(model, grads)
        return loss

    @partial(mx.compile, inputs=model.state)
    def eval_fn(X, y):
        return mx.mean(mx.argmax(model(X), axis=1) == y)

    train_accuracy = []
    for e in range(num_epochs):
        tic = time.perf_counter()
        for X, y in batch_iterate(batch_size, train_images, train_labels):
            loss = step(X, y)
            mx.eval(state)  # PLANT no_eval: pass
            pass  # PLANT lazy_append: train_accuracy.append(mx.mean(mx.argmax(model(X), axis=1) == y))
        accuracy = eval_fn(test_images, test_labels)
        toc = time.perf_counter()
        print(
            f"Epoch {e}: Test accuracy {accuracy.item():.3f},"
            f" Time {toc - tic:.3f} (s)"
        )
    print(f"Last training loss {loss.item():.3f}")
    if train_accuracy:
        print(f"Train accuracy over {len(train_accuracy)} steps: {mx.mean(mx.stack(train_accuracy)).item():.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser("Train a simple MLP on MNIST with MLX.")
    parser.add_argument("--gpu", action="store_true", help="Use the Metal back-end.")
    parser.add_argument("--epochs", type=int, default=1, help="Epochs to train (default: 1).")
    parser.add_argument("--train-size", type=int, default=38400, help="Training images (default: 38400).")
    args = parser.parse_args()
    if not args.gpu:
        mx.set_default_device(mx.cpu)
    main(args)
