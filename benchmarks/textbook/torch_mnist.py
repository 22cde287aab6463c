"""PyTorch's MNIST example: pytorch/examples, mnist/main.py, as a user runs it (no leakdoctor code here).

Kept from the original: the argument parser (batch size, test batch size, epochs, lr, gamma, --no-cuda,
--no-mps, --dry-run, seed, log interval, --save-model), `Net` (two 3x3 convolutions, max-pool, dropout 0.25
and 0.5, two linear layers, log-softmax), `train` and `test` as written (NLL loss, `loss.item()` printed
every log_interval batches; the test loss summed under `torch.no_grad()`), Adadelta (lr 1.0) with StepLR
(gamma 0.7) stepped every epoch, a `datasets.MNIST`-style Dataset whose `__getitem__` makes a PIL image and
applies `transforms.Compose([ToTensor(), Normalize((0.1307,), (0.3081,))])`, and the DataLoaders with
`num_workers=1` (the original's CUDA setting, here always, --num-workers to change it).

Changed: MNIST (downloaded by torchvision, not installed here) is replaced by synthetic images of the same
shape (_mnist.py), torchvision's MNIST class and transforms by small stand-ins doing the same; sizes shrunk
to run 1200 steps in well under a minute on one core: batch 16 (64), convolutions 8 and 16 channels wide
(32 and 64, so fc1 takes 2304 features, not 9216), 6400 training images (60000), 1000 test images (10000),
3 epochs (14). As users add to it, `train` also sums the epoch's loss (`loss.item()`), prints its average
and returns the sum, which `main` adds up over the run, and every batch's loss goes into a `history` list
for a loss curve; CUDA/MPS are unused.

Lines ending in `# PLANT name: code` are where benchmarks/bench_textbook.py plants one textbook leak (it
runs a copy with that one line replaced by `code`); a `pass` there is inert in this clean script, and
`CACHE` and `MNIST.samples` stay empty.
"""

from __future__ import print_function

import argparse

import _mnist
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from PIL import Image
from torch.optim.lr_scheduler import StepLR

#: Batches kept by (epoch, batch): filled only by the step_cache plant.
CACHE = {}


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(2304, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


class ToTensor:
    """transforms.ToTensor: a PIL image to a float tensor in [0, 1] with a channel axis."""

    def __call__(self, pic):
        return torch.from_numpy(np.asarray(pic, dtype=np.float32) / 255.0).unsqueeze(0)


class Normalize:
    """transforms.Normalize."""

    def __init__(self, mean, std):
        self.mean, self.std = mean[0], std[0]

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


class Compose:
    """transforms.Compose."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class MNIST(torch.utils.data.Dataset):
    """torchvision.datasets.MNIST's shape: uint8 `data`, `targets`, a PIL image per item, the transform."""

    def __init__(self, root, train=True, download=False, transform=None, train_size=6400, test_size=1000):
        images, labels, test_images, test_labels = _mnist.mnist(train_size, test_size)
        self.data = torch.from_numpy(images if train else test_images)
        self.targets = torch.from_numpy(labels if train else test_labels)
        self.transform = transform
        self.samples = []  # the transformed samples: filled only by the worker_samples plant

    def __getitem__(self, index):
        img, target = self.data[index], int(self.targets[index])
        img = Image.fromarray(img.numpy(), mode="L")
        if self.transform is not None:
            img = self.transform(img)
        pass  # PLANT worker_samples: self.samples.append(img)
        return img, target

    def __len__(self):
        return len(self.data)


def train(args, model, device, train_loader, optimizer, epoch, history):
    model.train()
    epoch_loss = 0.0
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        pass  # PLANT forward_hook: model.conv2.register_forward_hook(lambda module, inputs, output: None)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        epoch_loss += loss.item()  # PLANT total_loss: epoch_loss += loss
        history.append(loss.item())  # PLANT keep_outputs: history.append(output)
        pass  # PLANT step_cache: CACHE[epoch, batch_idx] = data
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break
    print('Train Epoch: {} Average loss: {:.4f}'.format(epoch, epoch_loss / len(train_loader)))
    return epoch_loss


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))


def main():
    # Training settings
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=16, metavar='N',
                        help='input batch size for training (default: 16)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=3, metavar='N',
                        help='number of epochs to train (default: 3)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='disables CUDA training')
    parser.add_argument('--no-mps', action='store_true', default=False,
                        help='disables macOS GPU training')
    parser.add_argument('--dry-run', action='store_true', default=False,
                        help='quickly check a single pass')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                        help='how many batches to wait before logging training status')
    parser.add_argument('--save-model', action='store_true', default=False,
                        help='For Saving the current Model')
    parser.add_argument('--num-workers', type=int, default=1, metavar='N',
                        help='DataLoader worker processes (default: 1)')
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    use_mps = not args.no_mps and torch.backends.mps.is_available()

    torch.manual_seed(args.seed)

    if use_cuda:
        device = torch.device("cuda")
    elif use_mps:
        device = torch.device("mps")
    else:
        device = torch.device("cpu")

    train_kwargs = {'batch_size': args.batch_size, 'num_workers': args.num_workers}
    test_kwargs = {'batch_size': args.test_batch_size, 'num_workers': args.num_workers}
    if use_cuda:
        cuda_kwargs = {'pin_memory': True,
                       'shuffle': True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)

    transform = Compose([
        ToTensor(),
        Normalize((0.1307,), (0.3081,))
    ])
    dataset1 = MNIST('../data', train=True, download=True,
                     transform=transform)
    dataset2 = MNIST('../data', train=False,
                     transform=transform)
    train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    history = []  # every batch's training loss, for a loss curve
    total_loss = 0.0
    for epoch in range(1, args.epochs + 1):
        total_loss += train(args, model, device, train_loader, optimizer, epoch, history)
        test(model, device, test_loader)
        scheduler.step()
    print('Average training loss: {:.4f} over {} batches'.format(total_loss / len(history), len(history)))

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == '__main__':
    main()
