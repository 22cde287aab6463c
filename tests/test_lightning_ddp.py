"""Two DDP ranks on CPU, for real: strategy="ddp" with Lightning's subprocess launcher, which starts this
file again as the script of rank 1. Rank 1 keeps its losses in `self.outputs`, rank 0 does not; each
rank measures itself, and rank 0 writes one summary with both ranks and rank 1's finding."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from helpers import kept, place
from torch import nn

STEPS = 200
ROOT = Path(__file__).resolve().parent.parent


class RankLeaky(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
        self.outputs = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        if self.global_rank == 1:
            self.outputs.append(loss)  # the leak, on rank 1 only
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(folder: str) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(2 * 64 * STEPS, 64), torch.randn(2 * 64 * STEPS, 1))
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=STEPS, logger=False,
                        callbacks=[LeakDoctorCallback(summary_path=Path(folder) / "leaks.json", verbose=False)],
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(RankLeaky(), torch.utils.data.DataLoader(data, batch_size=64))


def test_two_ddp_ranks_make_one_summary(tmp_path):
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "tests/test_lightning_ddp.py", str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["leaks.json", "leaks.rank1.json"]  # rank 1's own, written when it found the leak
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["framework"] == "lightning" and summary["rank"] == 0 and summary["steps"] == STEPS
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["steps"] for r in ranks] == [STEPS, STEPS]
    assert ranks[0]["verdict"] == "clean" and kept(ranks[0]) == []
    assert ranks[1]["verdict"] == "leak" and "rss_bytes" in ranks[1]["series"]
    found = [f for f in summary["findings"] if f["cause"] == "retained_graph"]
    append_line = RankLeaky.training_step.__code__.co_firstlineno + 4  # where the list is appended to
    assert len(found) == 1 and place(found[0]) == f"RankLeaky.outputs (tests/test_lightning_ddp.py:{append_line})"
    assert found[0] == ranks[1]["findings"][0]  # rank 1's finding, gathered by rank 0
    assert summary["verdict"] == "leak"
    # on the list's length: the losses were kept after backward(), so their graphs hold only numbers
    assert found[0]["metric"] == "len(RankLeaky.outputs)"
    # rank 1's alone: rank 0 has no finding of that cause, metric and place (merged in, not seen on rank 0)
    key = (found[0]["cause"], found[0]["metric"], place(found[0]))
    assert key not in {(f["cause"], f["metric"], place(f)) for f in ranks[0]["findings"]}, ranks[0]["findings"]


if __name__ == "__main__":
    main(sys.argv[1])
