"""LeakDoctorCallback with the `pytorch_lightning` import style (a package of its own, with its own
Callback class), in a run that ends by an exception: the summary is still written. Its logger refuses
leakdoctor's metrics: the callback reports that once and training goes on."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from helpers import isolated, says
from pytorch_lightning.loggers import CSVLogger
from torch import nn

from leakdoctor import LeakDoctorWarning


class Failing(pl.LightningModule):
    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.net = nn.Linear(64, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("data went bad")
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RefusingLogger(CSVLogger):
    def log_metrics(self, metrics, step=None):
        if any(name.startswith("leakdoctor") for name in metrics):
            raise OSError("disk full")
        super().log_metrics(metrics, step)


def fit_that_fails(fail_at: int, folder: str) -> dict:
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    callback = LeakDoctorCallback(summary_path=Path(folder) / "leaks.json", verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(64 * (fail_at + 10), 64), torch.randn(64 * (fail_at + 10), 1))
    trainer = pl.Trainer(max_steps=fail_at + 10, callbacks=[callback], logger=RefusingLogger(folder),
                         log_every_n_steps=10, accelerator="cpu", devices=1, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    raised = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", LeakDoctorWarning)
        try:
            trainer.fit(Failing(fail_at), torch.utils.data.DataLoader(data, batch_size=64))
        except RuntimeError as err:
            raised = str(err)
    return {"raised": raised, "summary": json.loads((Path(folder) / "leaks.json").read_text()),
            "warnings": [str(w.message) for w in caught],
            "bases": [f"{base.__module__}.{base.__name__}" for base in type(callback).__mro__],
            "lightning_imported": "lightning.pytorch" in sys.modules}


def test_pytorch_lightning_style_and_summary_written_on_exception(tmp_path):
    result = isolated(fit_that_fails, 30, str(tmp_path))
    assert result["raised"] == "data went bad"
    assert "pytorch_lightning.callbacks.callback.Callback" in result["bases"]
    assert not result["lightning_imported"]  # built on the package in use only
    summary = result["summary"]
    assert summary["framework"] == "lightning" and summary["steps"] == 30
    assert says(summary["notes"], "ended", error="RuntimeError", step=30), summary["notes"]
    assert result["warnings"] == [  # once, and the run went on to step 30
        "leakdoctor: logging failed (OSError: disk full); switched off for the rest of the run"]
