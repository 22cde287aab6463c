"""A LightningModule that keeps a per-step metric in `self.outputs` for the epoch end and never clears it
(Lightning #1510's pattern, `outputs.append(...)` without the clearing in `on_train_epoch_end`). The
metric is the error on a fixed probe batch, computed in training_step with grad enabled, so each kept
tensor holds its autograd graph and the activations that graph saved."""

from __future__ import annotations

import logging
import warnings

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from _harness import Truth, marker
from torch import nn

from leakdoctor.callbacks.lightning import LeakDoctorCallback

TRUTH = Truth(
    leak=True, cause="retained_graph", framework="lightning", remedy="detach_retained", steps=160,
    remedy_steps=220, start=0,
    what="self.outputs.append(probe error computed with grad) in training_step, never cleared",
    source="Lightning #1510",
    location=(marker(__file__, "KEEP-LOSS"),),
)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1))
        self.outputs = []
        generator = torch.Generator().manual_seed(1)
        self.probe_x, self.probe_y = torch.randn(512, 64, generator=generator), torch.randn(512, 1, generator=generator)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.outputs.append(F.mse_loss(self.net(self.probe_x), self.probe_y))  # KEEP-LOSS
        return F.mse_loss(self.net(x), y)

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
    x = torch.randn(h.length * 512, 64)
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(len(x), 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=512)
    trainer = L.Trainer(max_steps=h.length, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[*h.callbacks(LeakDoctorCallback), Tick(h)])
    trainer.fit(Regressor(), loader)
