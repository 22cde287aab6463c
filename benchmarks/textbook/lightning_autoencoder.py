"""Lightning's MNIST autoencoder example: Lightning-AI/pytorch-lightning, examples/pytorch/basics/autoencoder.py,
as a user runs it (no leakdoctor code here).

Kept from the original: `LitAutoEncoder` (encoder 784-64-3, decoder 3-64-784, ReLU; `save_hyperparameters`),
`training_step`/`validation_step`/`test_step` through `_common_step` (flatten, MSE, `self.log(f"{stage}_loss",
loss, on_step=True)`), `predict_step`, Adam (lr 10e-3), `MyDataModule` (batch 32, a seeded `random_split` of
the training images into train and validation, the four dataloaders), seed 1234, and `cli_main`'s sequence:
fit (validation every epoch), test and predict from the best checkpoint, print the first prediction.

Changed: MNIST (downloaded) is replaced by synthetic images of the same shape in [0, 1] (_mnist.py) in a
TensorDataset; sizes shrunk to run 1000 steps in well under a minute on one core: 6400 training images
split 5760/640 (55000/5000), 640 test images (10000), 5 epochs (10 by the CLI's trainer defaults; --epochs);
LightningCLI (jsonargparse is not installed) is replaced by building the module, data module and Trainer
from argparse options, the Trainer keeping its defaults (logger and checkpoints under the working
directory) but its progress bar; the ImageSampler callback is left out (it needs torchvision). The module has a
`training_step_outputs` list, as Lightning's docs show for `on_train_epoch_end`, left empty here.

A line ending in `# PLANT name: code` is where benchmarks/bench_textbook.py plants one textbook leak (it
runs a copy with that one line replaced by `code`); the `pass` there is inert in this clean script.
"""

import argparse

import _mnist
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


class LitAutoEncoder(LightningModule):
    """
    >>> LitAutoEncoder()  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    LitAutoEncoder(
      (encoder): ...
      (decoder): ...
    )
    """

    def __init__(self, hidden_dim: int = 64, learning_rate=10e-3):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 3))
        self.decoder = nn.Sequential(nn.Linear(3, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 28 * 28))
        self.training_step_outputs = []

    def forward(self, x):
        z = self.encoder(x)
        return self.decoder(z)

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, batch_idx, "train")

    def validation_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=None):
        x = self._prepare_batch(batch)
        return self(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

    def _prepare_batch(self, batch):
        x, _ = batch
        return x.view(x.size(0), -1)

    def _common_step(self, batch, batch_idx, stage: str):
        x = self._prepare_batch(batch)
        x_hat = self(x)
        loss = F.mse_loss(x, x_hat)
        self.log(f"{stage}_loss", loss, on_step=True)
        if stage == "train":
            pass  # PLANT train_outputs: self.training_step_outputs.append(x_hat)
        return loss


class MyDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 32, train_size: int = 6400, test_size: int = 640):
        super().__init__()
        images, _labels, test_images, test_labels = _mnist.mnist(train_size, test_size)
        dataset = TensorDataset(torch.from_numpy(images).float().unsqueeze(1) / 255.0, torch.from_numpy(_labels))
        self.mnist_test = TensorDataset(torch.from_numpy(test_images).float().unsqueeze(1) / 255.0,
                                        torch.from_numpy(test_labels))
        self.mnist_train, self.mnist_val = random_split(
            dataset, [train_size - train_size // 10, train_size // 10], generator=torch.Generator().manual_seed(42)
        )
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.mnist_train, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.mnist_val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.mnist_test, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.mnist_test, batch_size=self.batch_size)


def cli_main():
    parser = argparse.ArgumentParser(description="MNIST autoencoder example.")
    parser.add_argument("--epochs", type=int, default=5, help="the Trainer's max_epochs")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    seed_everything(1234)
    model = LitAutoEncoder()
    datamodule = MyDataModule(batch_size=args.batch_size)
    trainer = Trainer(max_epochs=args.epochs, enable_progress_bar=False)
    trainer.fit(model, datamodule=datamodule)
    trainer.test(ckpt_path="best", datamodule=datamodule)
    predictions = trainer.predict(ckpt_path="best", datamodule=datamodule)
    print(predictions[0])


if __name__ == "__main__":
    cli_main()
