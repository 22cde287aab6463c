"""Lightning's MNIST autoencoder example, reproduced: Lightning-AI/pytorch-lightning,
examples/pytorch/basics/autoencoder.py.

The author's script: `LitAutoEncoder` (encoder 784-64-3, decoder 3-64-784, ReLU), a `_common_step` that
flattens the batch and logs `{stage}_loss` (MSE) with `on_step=True` for train, val and test, Adam (lr
10e-3); `MyDataModule` (batch 32) splits the training images 55000/5000 into train and validation; the
Trainer fits (validation every epoch), then tests and predicts from the best checkpoint; seed 1234.

Changed: MNIST (downloaded) is replaced by synthetic images of the same shape in [0, 1]; sizes shrunk to
run 1000+ steps in about a minute on CPU: 5 epochs (10), the training images derived from --steps with a
tenth of them for validation and 640 test images (55000, 5000, 10000). The example's LightningCLI is
replaced by building the module, data module and Trainer directly (the CLI would parse this script's
options), so the Trainer keeps its defaults (a logger and checkpoints, here under a temporary folder);
the ImageSampler callback is left out (it needs torchvision and writes PNG grids).

Leak (--leak): the module keeps each training step's reconstruction in `self.training_step_outputs` to
build an image grid at the epoch's end, as Lightning's docs show for `on_train_epoch_end`, but never
clears the list (Lightning #1510's pattern): every batch's reconstruction, with its autograd graph,
stays alive.
"""

from __future__ import annotations

import tempfile
import time

import _common as common
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from leakdoctor.callbacks.lightning import LeakDoctorCallback  # leakdoctor


class LitAutoEncoder(LightningModule):
    def __init__(self, hidden_dim: int = 64, learning_rate=10e-3, keep_outputs: bool = False):
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
        if stage == "train" and self.hparams.keep_outputs:
            self.training_step_outputs.append(x_hat)  # LEAK
        return loss


class MyDataModule(LightningDataModule):
    def __init__(self, train: int, batch_size: int = 32):
        super().__init__()
        images, labels, test_images, test_labels = common.mnist(train + train // 10, 640)
        dataset = TensorDataset(torch.from_numpy(images).float().unsqueeze(1) / 255.0, torch.from_numpy(labels))
        self.mnist_test = TensorDataset(torch.from_numpy(test_images).float().unsqueeze(1) / 255.0,
                                        torch.from_numpy(test_labels))
        self.mnist_train, self.mnist_val = random_split(
            dataset, [train, train // 10], generator=torch.Generator().manual_seed(42))
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.mnist_train, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.mnist_val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.mnist_test, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.mnist_test, batch_size=self.batch_size)


def main() -> None:
    args = common.arguments(__doc__, steps=1000)
    epochs = 5
    seed_everything(1234)
    model = LitAutoEncoder(keep_outputs=args.leak)
    datamodule = MyDataModule(train=32 * -(-args.steps // epochs))
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(max_epochs=epochs, default_root_dir=root,
                          callbacks=common.callbacks(LeakDoctorCallback, args))  # leakdoctor
        began = time.perf_counter()
        trainer.fit(model, datamodule=datamodule)
        seconds = time.perf_counter() - began
        trainer.test(ckpt_path="best", datamodule=datamodule)
        predictions = trainer.predict(ckpt_path="best", datamodule=datamodule)
        print(predictions[0])
    common.done(trainer.global_step, seconds)


if __name__ == "__main__":
    main()
