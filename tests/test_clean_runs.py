"""Trust on clean runs (issue #10): correct training that keeps a loss history or fills a bounded cache
ends clean, every run, while the leaks next to them are still found. Each run is a real loop in a
fresh process."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from helpers import counts, isolated, kept, place

from leakdoctor import LeakDoctor
from leakdoctor.examples.numpy_cycles import MLP


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# {marker}" in text)


def _data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((256, 256))
    return x, x[:, :10].argmax(axis=1)


def numpy_loop(plant: str, steps: int = 500) -> dict:
    """A numpy MLP loop with a loss history, and one planted behaviour."""
    x, y = _data()
    model = MLP()

    @lru_cache(maxsize=128)
    def features(key: int) -> np.ndarray:
        return np.full(32_768, float(key))  # 256 KiB each: the cache fills to 32 MiB over 128 steps

    class Trainer:
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.kept: list[np.ndarray] = []

    trainer = Trainer()
    cache: dict[int, np.ndarray] = {}
    with LeakDoctor(verbose=False) as doctor:
        doctor.watch_object(trainer, "trainer")
        for step in range(steps):
            loss, _ = model.step(x, y)
            trainer.losses.append(float(loss))  # a loss history: 24 B a step
            if plant == "lru":
                features(step).sum()
            elif plant == "dict" and len(cache) < 100:
                cache[step] = np.ones(262_144)  # 2 MiB each: fills to 200 MiB over 100 steps, then stays
            elif plant == "arrays":
                trainer.kept.append(np.ones(131_072))  # LEAK: 1 MiB a step
            doctor.step()
    return doctor.summary.to_dict()


@pytest.mark.parametrize("run", range(3))
def test_a_bounded_lru_cache_that_fills_slowly_ends_clean_every_run(run: int) -> None:
    summary = isolated(numpy_loop, "lru")
    assert summary["verdict"] == "clean", summary["findings"]
    assert not kept(summary)


def test_a_cache_of_2_mib_entries_that_fills_then_stays_bounded_ends_clean() -> None:
    summary = isolated(numpy_loop, "dict")
    assert summary["verdict"] == "clean", summary["findings"]


def test_a_loss_history_of_floats_is_not_a_leak() -> None:
    summary = isolated(numpy_loop, "none")
    assert summary["verdict"] == "clean" and not kept(summary)


def test_a_list_of_1_mib_arrays_next_to_the_loss_history_is_found() -> None:
    """Found once, by whichever series is suspect first: the list's length (named by its attribute) or
    resident memory (named by the line that appends)."""
    summary = isolated(numpy_loop, "arrays", steps=300)
    leaks = [f for f in summary["findings"] if counts(f)]
    assert len(leaks) == 1, [(f["cause"], f["metric"], f["detected_step"], f["evidence"]) for f in leaks]
    (finding,) = leaks
    if finding["cause"] == "container_growth":
        assert finding["metric"] == "len(trainer.kept)" and "Trainer.kept" in place(finding)
        assert finding["rate_per_step"] == pytest.approx(1.0, rel=0.05)
    else:
        assert finding["cause"] == "python_objects" and finding["metric"] == "rss_bytes"
        assert place(finding).endswith(f"test_clean_runs.py:{_line_of('LEAK: 1 MiB')}")
        assert finding["rate_per_step"] == pytest.approx(2**20, rel=0.3)


def lightning_losses(steps: int = 400) -> dict:
    """A correct Lightning run whose module keeps `self.losses.append(loss.item())`."""
    import lightning as L
    import torch
    from torch import nn

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
            self.losses: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 8, 32), torch.randn(steps * 8, 1))
    doctor = LeakDoctorCallback(verbose=False)
    trainer = L.Trainer(max_epochs=1, callbacks=[doctor], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
    return doctor.summary.to_dict()


def test_a_lightning_module_keeping_loss_items_ends_clean() -> None:
    summary = isolated(lightning_losses)
    assert summary["verdict"] == "clean", summary["findings"]
    assert not kept(summary)
