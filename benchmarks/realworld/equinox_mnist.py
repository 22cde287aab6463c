"""Equinox's "Convolutional Neural Network on MNIST" example, reproduced: patrick-kidger/equinox,
examples/mnist.ipynb.

The author's script: an `eqx.Module` CNN holding a list of layers (Conv2d 1->3 4x4, MaxPool2d 2, relu,
ravel, Linear 1728->512, sigmoid, Linear 512->64, relu, Linear 64->10, log_softmax) applied per image
with `jax.vmap`; a cross-entropy loss and an accuracy, both `eqx.filter_jit`; `evaluate` averages them
over the test loader; `optax.adamw(3e-4)` initialised on the model's arrays; one `eqx.filter_jit`
`make_step` (`eqx.filter_value_and_grad`, `optim.update`, `eqx.apply_updates`); batches of 64 from an
endlessly repeated PyTorch DataLoader (shuffled), converted to numpy; every 30 steps (and at the last)
the test set is evaluated and `train_loss.item()` printed with the test loss and accuracy.

Changed: MNIST (torchvision) is replaced by synthetic images of the same shape, normalised to [-1, 1] as
the example's transform does, in a TensorDataset; 4096 training images (60000) and 320 test images
(10000), batch 32 (64), --steps steps (300 in the notebook, 1000 here), so that 1000+ steps run in about
a minute on CPU; jaxtyping annotations left out; `optim.update` gets the model's arrays (`eqx.filter(model, eqx.is_array)`),
as the current notebook does.

Leak (--leak): the user switches to RAdam as optax wrote it up to 0.2.2 (optax#969;
leakdoctor/examples/old_radam.py) and, against the example's advice, applies the optimizer outside the
JIT region (`make_step` split into a jitted gradient and an eager update): the optimizer's `lax.cond`
over closures is traced and compiled again on every step and every executable is kept (jax#12719).
"""

from __future__ import annotations

import time

import _common as common
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import torch

from leakdoctor.callbacks.flax import LeakDoctor  # leakdoctor
from leakdoctor.examples.old_radam import old_radam

# Hyperparameters
BATCH_SIZE = 32
LEARNING_RATE = 3e-4
PRINT_EVERY = 30
SEED = 5678

key = jax.random.PRNGKey(SEED)


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


def loss(model, x, y):
    # Our input has the shape (BATCH_SIZE, 1, 28, 28), but our model operations on
    # a single input input image of shape (1, 28, 28): jax.vmap maps it over the batch axis.
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
    """The average accuracy of the model on a batch."""
    pred_y = jax.vmap(model)(x)
    pred_y = jnp.argmax(pred_y, axis=1)
    return jnp.mean(y == pred_y)


def evaluate(model, testloader):
    """The average loss and accuracy of the model over the test set."""
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


def train(model, trainloader, testloader, optim, steps, print_every, args):
    with common.attach(LeakDoctor, args, tx=optim) as doctor:  # leakdoctor
        optim = doctor.tx  # leakdoctor
        # Just like earlier: It only makes sense to train the arrays in our model,
        # so filter out everything else.
        opt_state = optim.init(eqx.filter(model, eqx.is_array))

        # Always wrap everything -- computing gradients, running the optimiser, updating
        # the model -- into a single JIT region. This ensures things run as fast as possible.
        @eqx.filter_jit
        def make_step(model, opt_state, x, y):
            loss_value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
            updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            model = eqx.apply_updates(model, updates)
            return model, opt_state, loss_value

        # --leak: the step split in two, only the gradients jitted.
        gradients = eqx.filter_jit(eqx.filter_value_and_grad(loss))

        # Loop over our training dataset as many times as we need.
        def infinite_trainloader():
            while True:
                yield from trainloader

        for step, (x, y) in zip(range(steps), infinite_trainloader()):
            # PyTorch dataloaders give PyTorch tensors by default,
            # so convert them to NumPy arrays.
            x = x.numpy()
            y = y.numpy()
            if args.leak:
                train_loss, grads = gradients(model, x, y)
                updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))  # LEAK
                model = eqx.apply_updates(model, updates)
            else:
                model, opt_state, train_loss = make_step(model, opt_state, x, y)
            doctor.step(opt_state=opt_state, params=eqx.filter(model, eqx.is_array))  # leakdoctor
            if (step % print_every) == 0 or (step == steps - 1):
                test_loss, test_accuracy = evaluate(model, testloader)
                print(f"{step=}, train_loss={train_loss.item()}, "
                      f"test_loss={test_loss.item()}, test_accuracy={test_accuracy.item()}")
    return model


def dataset(images, labels):
    """ToTensor and Normalize((0.5,), (0.5,)): images in [-1, 1], shape (1, 28, 28)."""
    x = (torch.from_numpy(images).float().unsqueeze(1) / 255.0 - 0.5) / 0.5
    return torch.utils.data.TensorDataset(x, torch.from_numpy(labels))


def main() -> None:
    global key
    args = common.arguments(__doc__, steps=1000)
    torch.manual_seed(SEED)
    train_images, train_labels, test_images, test_labels = common.mnist(4096, 320)
    trainloader = torch.utils.data.DataLoader(dataset(train_images, train_labels), batch_size=BATCH_SIZE,
                                              shuffle=True)
    testloader = torch.utils.data.DataLoader(dataset(test_images, test_labels), batch_size=BATCH_SIZE,
                                             shuffle=True)
    key, subkey = jax.random.split(key, 2)
    model = CNN(subkey)
    optim = old_radam(LEARNING_RATE) if args.leak else optax.adamw(LEARNING_RATE)  # LEAK
    began = time.perf_counter()
    train(model, trainloader, testloader, optim, args.steps, PRINT_EVERY, args)
    common.done(args.steps, time.perf_counter() - began)


if __name__ == "__main__":
    main()
