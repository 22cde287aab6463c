"""A LightningModule that keeps every loss, graph and all, in self.outputs (run by tests/test_run.py under
`leakdoctor run`, unedited). `lightning_outputs.py STEPS [DEVICES]`: more than one device trains with
DDP on CPU, Lightning starting the other ranks as subprocesses."""

import logging
import sys
import warnings

import lightning.pytorch as L
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
torch.set_num_threads(1)


class Leaky(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.outputs = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)  # MADE: the tensor kept below
        self.outputs.append(loss)  # KEPT: every loss with its graph, never cleared
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 150
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    L.seed_everything(0, verbose=False)
    x = torch.randn(steps * 32, 32)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=32)
    trainer = L.Trainer(max_steps=steps, logger=False, accelerator="cpu", devices=devices, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, strategy="ddp" if devices > 1 else "auto")
    trainer.fit(Leaky(), data)
    print(f"rank {trainer.global_rank} trained {trainer.global_step} steps")
