"""Benign: a Lightning fit that validates every 40 training steps on a large validation batch. Each
validation allocates about 100 MB of activations for a moment; resident memory jumps at every
validation and falls back (or, once the C allocator keeps the freed memory, stays at the high-water
mark): periodic spikes and a step up, no trend."""

from __future__ import annotations

import logging
import warnings

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from _harness import Truth
from torch import nn

from leakdoctor.callbacks.lightning import LeakDoctorCallback

TRUTH = Truth(
    leak=False, cause=None, framework="lightning", steps=200, start=0,
    what="validation every 40 steps on a 24k-row batch (~100 MB of activations)", source="val_check_interval",
)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Tick(L.Callback):
    def __init__(self, h) -> None:
        self.h = h

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.h.tick()


def run(h) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    x = torch.randn(h.length * 256, 64)
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(len(x), 1)
    x_val = torch.randn(24_000, 64)
    y_val = x_val[:, :1] * 0.5
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_val, y_val), batch_size=24_000)
    trainer = L.Trainer(max_steps=h.length, val_check_interval=40, num_sanity_val_steps=0, accelerator="cpu",
                        devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, callbacks=[*h.callbacks(LeakDoctorCallback), Tick(h)])
    trainer.fit(Regressor(), train, val)
