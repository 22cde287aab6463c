"""Equinox's "Convolutional Neural Network on MNIST" example: patrick-kidger/equinox, examples/mnist.ipynb,
as a user runs it (no leakdoctor code here).

Kept from the original: the `eqx.Module` CNN holding a list of layers (Conv2d 1->3 4x4, MaxPool2d 2, relu,
ravel, Linear 1728->512, sigmoid, Linear 512->64, relu, Linear 64->10, log_softmax) applied per image with
`jax.vmap`; the cross-entropy `loss` and `compute_accuracy`, both `eqx.filter_jit`; `evaluate` over the test
loader; `optax.adamw` initialised on `eqx.filter(model, eqx.is_array)`; one `eqx.filter_jit` `make_step`
(`eqx.filter_value_and_grad`, `optim.update`, `eqx.apply_updates`); batches from an endlessly repeated,
shuffled PyTorch DataLoader converted to numpy; every PRINT_EVERY steps the test set is evaluated and
`train_loss.item()` printed with the test loss and accuracy.

Changed: MNIST (torchvision) is replaced by synthetic images of the same shape normalised to [-1, 1] as the
example's transform does (_mnist.py), in a TensorDataset; 4096 training images (60000), 320 test images
(10000), batch 32 (64), 1000 steps (300), PRINT_EVERY 100 (30), so that the run takes under a minute on one
core (--steps to change it); jaxtyping annotations left out. `make_step` also takes a learning-rate scale, a linear decay over the
run, passed as an array (`jnp.asarray`), as users add.

A line ending in `# PLANT name: code` is where benchmarks/bench_textbook.py plants one textbook leak (it
runs a copy with that one line replaced by `code`).
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import torch

import _mnist

# Hyperparameters
BATCH_SIZE = 32
LEARNING_RATE = 3e-4
STEPS = 1000
PRINT_EVERY = 100
SEED = 5678

parser = argparse.ArgumentParser(description="Convolutional Neural Network on MNIST")
parser.add_argument("--steps", type=int, default=STEPS)
STEPS = parser.parse_args().steps

key = jax.random.PRNGKey(SEED)


def dataset(images, labels):
    """ToTensor and Normalize((0.5,), (0.5,)): images in [-1, 1], shape (1, 28, 28)."""
    x = (torch.from_numpy(images).float().unsqueeze(1) / 255.0 - 0.5) / 0.5
    return torch.utils.data.TensorDataset(x, torch.from_numpy(labels))


train_images, train_labels, test_images, test_labels = _mnist.mnist(4096, 320)
train_dataset = dataset(train_images, train_labels)
test_dataset = dataset(test_images, test_labels)
trainloader = torch.utils.data.DataLoader(train_dataset, batch_size=BATCH_SIZE, shuffle=True)
testloader = torch.utils.data.DataLoader(test_dataset, batch_size=BATCH_SIZE, shuffle=True)


class CNN(eqx.Module):
    layers: list

    def __init__(self, key):
        key1, key2, key3, key4 = jax.random.split(key, 4)
        # Standard CNN setup: convolutional layer, followed by flattening,
        # with a small MLP on top.
        self.layers = [
            eqx.nn.Conv2d(1, 3, kernel_size=4, key=key1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(1728, 512, key=key2),
            jax.nn.sigmoid,
            eqx.nn.Linear(512, 64, key=key3),
            jax.nn.relu,
            eqx.nn.Linear(64, 10, key=key4),
            jax.nn.log_softmax,
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


key, subkey = jax.random.split(key, 2)
model = CNN(subkey)


def loss(model, x, y):
    # Our input has the shape (BATCH_SIZE, 1, 28, 28), but our model operations on
    # a single input input image of shape (1, 28, 28).
    #
    # Therefore, we have to use jax.vmap, which in this case maps our model over the
    # leading (batch) axis.
    pred_y = jax.vmap(model)(x)
    return cross_entropy(y, pred_y)


def cross_entropy(y, pred_y):
    # y are the true targets, and should be integers 0-9.
    # pred_y are the log-softmax'd predictions.
    pred_y = jnp.take_along_axis(pred_y, jnp.expand_dims(y, 1), axis=1)
    return -jnp.mean(pred_y)


loss = eqx.filter_jit(loss)  # JIT our loss function from earlier!


@eqx.filter_jit
def compute_accuracy(model, x, y):
    """This function takes as input the current model
    and computes the average accuracy on a batch.
    """
    pred_y = jax.vmap(model)(x)
    pred_y = jnp.argmax(pred_y, axis=1)
    return jnp.mean(y == pred_y)


def evaluate(model, testloader):
    """This function evaluates the model on the test dataset,
    computing both the average loss and the average accuracy.
    """
    avg_loss = 0
    avg_acc = 0
    for x, y in testloader:
        x = x.numpy()
        y = y.numpy()
        # Note that all the JAX operations happen inside `loss` and `compute_accuracy`,
        # and both have JIT wrappers, so this is fast.
        avg_loss += loss(model, x, y)
        avg_acc += compute_accuracy(model, x, y)
    return avg_loss / len(testloader), avg_acc / len(testloader)


optim = optax.adamw(LEARNING_RATE)


def train(model, trainloader, testloader, optim, steps, print_every):
    # Just like earlier: It only makes sense to train the arrays in our model,
    # so filter out everything else.
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    # Always wrap everything -- computing gradients, running the optimiser, updating
    # the model -- into a single JIT region. This ensures things run as fast as
    # possible.
    @eqx.filter_jit
    def make_step(model, opt_state, x, y, lr_scale):
        loss_value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        updates = jax.tree.map(lambda u: u * lr_scale, updates)
        model = eqx.apply_updates(model, updates)
        return model, opt_state, loss_value

    # Loop over our training dataset as many times as we need.
    def infinite_trainloader():
        while True:
            yield from trainloader

    for step, (x, y) in zip(range(steps), infinite_trainloader()):
        # PyTorch dataloaders give PyTorch tensors by default,
        # so convert them to NumPy arrays.
        x = x.numpy()
        y = y.numpy()
        model, opt_state, train_loss = make_step(model, opt_state, x, y, jnp.asarray(1.0 - step / steps))  # PLANT static_step: model, opt_state, train_loss = make_step(model, opt_state, x, y, 1.0 - step / steps)
        if (step % print_every) == 0 or (step == steps - 1):
            test_loss, test_accuracy = evaluate(model, testloader)
            print(
                f"{step=}, train_loss={train_loss.item()}, "
                f"test_loss={test_loss.item()}, test_accuracy={test_accuracy.item()}"
            )
    return model


model = train(model, trainloader, testloader, optim, STEPS, PRINT_EVERY)
