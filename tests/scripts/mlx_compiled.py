"""An MLX loop shaped like mlx-examples' mnist/main.py: the step compiled with
`@partial(mx.compile, inputs=state, outputs=state)` (optimizer.update inside it), `mx.eval(state)` after
each call, an eval_fn compiled too and called once per epoch; synthetic data (run by
tests/test_run_compiled.py under `leakdoctor run`, unedited). `python mlx_compiled.py STEPS [keep|no-eval]`:
with `keep`, every step's outputs are kept in a list (arrays that hold their graph: a real growth); with
`no-eval`, the state is never evaluated after a step and the run is one epoch long, as a run's first steps are
in mnist's 1875-batch epochs (the lazy graph chains across every step: nothing evaluates it)."""

import sys
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim


class MLP(nn.Module):
    def __init__(self, num_layers, input_dim, hidden_dim, output_dim):
        super().__init__()
        dims = [input_dim] + [hidden_dim] * num_layers + [output_dim]
        self.layers = [nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])]

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = nn.relu(layer(x))
        return self.layers[-1](x)


def loss_fn(model, X, y):
    return nn.losses.cross_entropy(model(X), y, reduction="mean")


def batch_iterate(batch_size, X, y):
    perm = mx.array(list(range(y.size)))
    for s in range(0, y.size, batch_size):
        ids = perm[s:s + batch_size]
        yield X[ids], y[ids]


def main(steps, mode):
    mx.random.seed(0)
    batch_size, batches = 32, steps if mode == "no-eval" else 50
    train_images = mx.random.normal((batch_size * batches, 64))
    train_labels = mx.random.randint(0, 10, (batch_size * batches,))
    test_images, test_labels = mx.random.normal((256, 64)), mx.random.randint(0, 10, (256,))
    model = MLP(2, 64, 128, 10)
    mx.eval(model.parameters())
    optimizer = optim.SGD(learning_rate=0.1)
    loss_and_grad_fn = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(X, y):
        loss, grads = loss_and_grad_fn(model, X, y)
        optimizer.update(model, grads)
        return loss

    @partial(mx.compile, inputs=model.state)
    def eval_fn(X, y):
        return mx.mean(mx.argmax(model(X), axis=1) == y)

    history, taken = [], 0
    while taken < steps:
        for X, y in batch_iterate(batch_size, train_images, train_labels):
            step(X, y)  # STEP-CALL
            if mode != "no-eval":
                mx.eval(state)
            if mode == "keep":
                history.append(model(X))  # KEPT: every step's outputs, never evaluated
            taken += 1
            if taken == steps:
                break
        accuracy = eval_fn(test_images, test_labels)
        mx.eval(accuracy)
    print(f"trained {taken} steps")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300, sys.argv[2] if len(sys.argv) > 2 else "")
