"""PyTorch's MNIST example, reproduced: pytorch/examples, mnist/main.py.

The author's script: the `Net` CNN (two 3x3 convolutions, max-pool, dropout 0.25 and 0.5, two linear
layers, log-softmax), Adadelta (lr 1.0) with a StepLR schedule (gamma 0.7) stepped every epoch, NLL loss,
`loss.item()` printed every `log_interval` batches, and a test pass after every epoch that sums the test
loss and counts correct predictions under `torch.no_grad()`.

Changed: MNIST (downloaded by torchvision) is replaced by synthetic images of the same shape, normalised
as the example's transform does (mean 0.1307, std 0.3081); sizes shrunk to run 1000+ steps in about a
minute on CPU: batch 16 (64), convolutions 8 and 16 channels wide (32 and 64), 4 epochs (14), the
training images derived from --steps, 1000 test images (10000); CUDA/MPS and --save-model left out.

Leak (--leak): the user registers a forward hook to look at conv2's activations inside the training loop,
so a new hook joins the module on every batch and none is removed; every forward pass runs all of them
(hooks registered every step, the guide seed's case).
"""

from __future__ import annotations

import time

import _common as common
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR

from leakdoctor.callbacks.torch import LeakDoctor  # leakdoctor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(2304, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def keep_activation(module, inputs, output):  # LEAK
    module.activation = output.detach()


def train(args, model, device, train_loader, optimizer, epoch, doctor):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        if args.leak:
            model.conv2.register_forward_hook(keep_activation)  # LEAK
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} "
                  f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}")
        doctor.step()  # leakdoctor


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)} "
          f"({100.0 * correct / len(test_loader.dataset):.0f}%)\n")


def options(parser) -> None:
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)


def dataset(images, labels) -> torch.utils.data.TensorDataset:
    """The example's transform: ToTensor (to [0, 1], a channel axis) and Normalize((0.1307,), (0.3081,))."""
    x = (torch.from_numpy(images).float().unsqueeze(1) / 255.0 - 0.1307) / 0.3081
    return torch.utils.data.TensorDataset(x, torch.from_numpy(labels))


def main() -> None:
    args = common.arguments(__doc__, steps=1200, extra=options)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    train_images, train_labels, test_images, test_labels = common.mnist(
        args.batch_size * -(-args.steps // args.epochs), 1000)
    train_loader = torch.utils.data.DataLoader(dataset(train_images, train_labels), batch_size=args.batch_size)
    test_loader = torch.utils.data.DataLoader(dataset(test_images, test_labels), batch_size=args.test_batch_size)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    began = time.perf_counter()
    with common.attach(LeakDoctor, args, model=model, optimizer=optimizer) as doctor:  # leakdoctor
        for epoch in range(1, args.epochs + 1):
            train(args, model, device, train_loader, optimizer, epoch, doctor)
            test(model, device, test_loader)
            scheduler.step()
    common.done(args.epochs * len(train_loader), time.perf_counter() - began)


if __name__ == "__main__":
    main()
