"""detach_retained on a container's length (issue #28): a LightningModule that appends every step's loss,
graph and all, to `self.step_losses` is found as retained_graph on `len(Model.step_losses)`, placed at the
line that appends; with remedies="all" its kept tensors are detached in place (the list still grows by
one detached number a step, as the user's code appends) and the remedy is judged on what it frees, the
graphs: effective, the run remedied. Without the remedy allowed, the fix says which one would act. The
same for a plain loop's watched object (`doctor.watch_object(trainer)`), where no torch integration looks
at the tensors: the container rule names the graphs and the same remedy acts on the list. Each run in a
fresh process (helpers.isolated), sampled every step (overhead=1.0)."""

from __future__ import annotations

import logging
import warnings

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from helpers import isolated, says, place
from torch import nn

STEPS = 320


def quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)


class StepLosses(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        self.step_losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.step_losses.append(loss)  # the leak: every loss kept with its graph
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


APPEND = StepLosses.training_step.__code__.co_firstlineno + 3


def step_losses_kept(steps: int, remedies: str) -> dict:
    quiet()
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    L.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 32, 32, generator=generator)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1] * 0.5), batch_size=32)
    doctor = LeakDoctorCallback(remedies=remedies, verbose=False, overhead=1.0, memory_limit="8GiB")
    model = StepLosses()
    trainer = L.Trainer(max_steps=steps, callbacks=[doctor], logger=False, accelerator="cpu", devices=1,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, data)
    kept = model.step_losses
    return {"summary": doctor.summary.to_dict(), "kept": len(kept),
            "with_graph": sum(t.grad_fn is not None for t in kept)}


class Trainer:
    """A plain-Python trainer that keeps a probe loss, computed with grad and never backpropagated."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1))
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.01)
        self.history = []

    def train_step(self, x: torch.Tensor) -> None:
        loss = self.net(x).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.history.append(self.net(x).pow(2).mean())  # TRAINER-APPEND


TRAINER_APPEND = Trainer.train_step.__code__.co_firstlineno + 5


def watched_trainer_kept(steps: int) -> dict:
    torch.set_num_threads(1)
    from leakdoctor import LeakDoctor

    trainer, x = Trainer(), torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    with LeakDoctor(remedies="all", verbose=False, overhead=1.0, memory_limit="8GiB") as doctor:
        doctor.watch_object(trainer)
        for _ in range(steps):
            trainer.train_step(x)
            doctor.step()
    return {"summary": doctor.summary.to_dict(), "kept": len(trainer.history),
            "with_graph": sum(t.grad_fn is not None for t in trainer.history)}


def retained(summary: dict) -> dict:
    found = [f for f in summary["findings"] if f["cause"] == "retained_graph"]
    assert len(found) == 1, ([(f["cause"], f["metric"], place(f)) for f in summary["findings"]], summary["notes"])
    return found[0]


def test_losses_kept_in_a_lightning_modules_list_are_detached_and_the_run_remedied():
    result = isolated(step_losses_kept, STEPS, "all")
    summary = result["summary"]
    found = retained(summary)
    assert found["metric"] == "len(StepLosses.step_losses)"
    assert place(found) == f"StepLosses.step_losses (tests/test_lightning_remedy.py:{APPEND})"
    remedy = found["remedy"]
    assert remedy is not None and remedy["name"] == "detach_retained", found
    # judged on the graphs it frees, not on the list's length, which grows on as the code appends
    assert remedy["effective"] is True and found["state"] == "remedied", found
    assert remedy["rate_after"] is None  # the list's length goes on growing: no rate after on the count
    assert summary["verdict"] == "remedied", summary["findings"]
    assert [f for f in summary["findings"] if f["state"] == "leak"] == []
    assert result["kept"] == STEPS and result["with_graph"] == 0  # the user's list intact, its graphs freed


def test_without_the_remedy_allowed_the_fix_names_the_one_that_would_act():
    result = isolated(step_losses_kept, STEPS, "safe")
    found = retained(result["summary"])
    assert found["remedy"] is None and found["state"] == "leak"
    assert place(found) == f"StepLosses.step_losses (tests/test_lightning_remedy.py:{APPEND})"
    assert says(found["recommendation"], "allow_remedy", remedy="detach_retained")
    assert result["with_graph"] == STEPS


def test_a_watched_objects_list_of_graphs_in_a_plain_loop_is_detached_and_the_run_remedied():
    result = isolated(watched_trainer_kept, 300)
    summary = result["summary"]
    found = retained(summary)
    assert found["metric"] == "len(Trainer.history)"
    assert place(found) == f"Trainer.history (tests/test_lightning_remedy.py:{TRAINER_APPEND})"
    remedy = found["remedy"]
    assert remedy is not None and remedy["name"] == "detach_retained" and remedy["effective"] is True, found
    assert found["state"] == "remedied" and summary["verdict"] == "remedied", summary["findings"]
    assert result["kept"] == 300 and result["with_graph"] == 0
