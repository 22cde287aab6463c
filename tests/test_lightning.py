"""LeakDoctorCallback in real Lightning runs, each in a fresh process (tests/helpers.isolated): a clean fit
that stays clean, unchanged and logged, and a LightningModule keeping its losses in `self.outputs`,
resumed from a checkpoint. (test_lightning_pl.py: the pytorch_lightning import style and an exception;
test_lightning_ddp.py: two DDP ranks.)"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import pickle
import warnings
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers import corpus_run, counts, isolated, kept, says, place
from torch import nn

STEPS = 320


def quiet() -> None:
    """Keep Lightning's start-up chatter out of the test output."""
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)


def loader(steps: int, batch: int = 64) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, 64, generator=generator)
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(steps * batch, 1, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)


def trainer_options(**options: object) -> dict:
    return dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                enable_checkpointing=False, **options)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class LeakyRegressor(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.outputs = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.outputs.append(loss)  # the leak: every loss kept with its graph, never cleared
        return loss


class LossRecorder(L.Callback):
    def __init__(self) -> None:
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def finding(summary: dict, cause: str) -> dict:
    found = [f for f in summary["findings"] if f["cause"] == cause]
    assert found, f"no {cause}: {[(f['cause'], f['metric']) for f in summary['findings']]}; notes {summary['notes']}"
    return found[0]


# --- a clean fit ---------------------------------------------------------------------------------------

def clean_fit(steps: int, folder: str) -> dict:
    """The same fit with the callback (remedies off, CSV logger) and without; what each saw."""
    quiet()
    from lightning.pytorch.loggers import CSVLogger

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    result = {}
    for watched in (True, False):
        L.seed_everything(0, verbose=False)
        recorder = LossRecorder()
        callbacks = [recorder]
        if watched:
            doctor = LeakDoctorCallback(summary_path=Path(folder) / "leaks.json")
            callbacks.append(doctor)
        trainer = L.Trainer(max_steps=steps, log_every_n_steps=50, callbacks=callbacks,
                            logger=CSVLogger(folder, name="run", version=int(watched)), **trainer_options())
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            trainer.fit(Regressor(), loader(steps))
        result["with" if watched else "without"] = recorder.losses
        if watched:
            result["printed"] = printed.getvalue()
            result["steps"] = doctor.doctor.steps
    result["summary"] = json.loads((Path(folder) / "leaks.json").read_text())
    with open(Path(folder) / "run" / "version_1" / "metrics.csv") as fh:
        result["logged"] = [{k: v for k, v in row.items() if v} for row in csv.DictReader(fh)]
    return result


def test_clean_fit_has_no_finding_identical_losses_and_logged_readings(tmp_path):
    result = isolated(clean_fit, STEPS, str(tmp_path))
    summary = result["summary"]
    assert summary["framework"] == "lightning" and summary["steps"] == STEPS == result["steps"]
    assert summary["verdict"] == "clean" and kept(summary) == [], summary["findings"]
    assert result["with"] == result["without"] and len(result["with"]) == STEPS
    assert says(result["printed"], "headline", framework="lightning", steps=STEPS, verdict="CLEAN")
    logged = [row for row in result["logged"] if "leakdoctor/rss_bytes" in row]
    assert [int(row["step"]) for row in logged] == list(range(50, STEPS + 1, 50))  # on logging steps only
    assert all(float(row["leakdoctor/rss_bytes"]) > 0 and "leakdoctor/torch_hooks" in row for row in logged)


def test_a_fit_validating_a_large_batch_stays_clean():
    """issue #10: a correct fit validating every 40 steps on a 24k-row batch raised native_memory in about
    a third of its runs: the first ladder's malloc_trim handed back what the validations had left in the C
    heap, and the training steps faulted some of those pages in again."""
    summary = isolated(corpus_run, "lightning_eval_spike")
    assert summary["verdict"] == "clean" and kept(summary) == [], (summary["findings"], summary["notes"])


# --- a module that keeps its losses, resumed from a checkpoint ---------------------------------------

def outputs_kept(steps: int, folder: str) -> dict:
    """Fit a module that appends its losses to self.outputs, save a checkpoint, resume it for as many
    steps again with a new callback (the module's list starts empty again, and leaks again)."""
    quiet()
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    L.seed_everything(0, verbose=False)
    # overhead=1.0: sample every step. This test is about naming and resuming, not pacing; at the default
    # 0.5% budget a 2 ms step is sampled every ~30 steps on a fast machine, too rarely for 200 steps.
    first = LeakDoctorCallback(remedies="all", verbose=False, overhead=1.0)
    trainer = L.Trainer(max_steps=steps, callbacks=[first], logger=False, **trainer_options())
    model = LeakyRegressor()
    trainer.fit(model, loader(2 * steps))
    checkpoint = Path(folder) / "run.ckpt"
    trainer.save_checkpoint(checkpoint)
    resumed = LeakDoctorCallback(remedies="all", verbose=False, overhead=1.0, summary_path=Path(folder) / "leaks.json")
    trainer = L.Trainer(max_steps=2 * steps, callbacks=[resumed], logger=False, **trainer_options())
    trainer.fit(LeakyRegressor(), loader(2 * steps), ckpt_path=checkpoint)
    return {"first": first.summary.to_dict(), "resumed": json.loads((Path(folder) / "leaks.json").read_text()),
            "training_step": LeakyRegressor.training_step.__code__.co_firstlineno}


def test_losses_kept_in_module_outputs_are_named_and_kept_across_resume(tmp_path):
    result = isolated(outputs_kept, 200, str(tmp_path))
    found = finding(result["first"], "retained_graph")
    assert found["metric"] == "len(LeakyRegressor.outputs)"
    append_line = result["training_step"] + 3  # where the list is appended to
    assert place(found) == f"LeakyRegressor.outputs (tests/test_lightning.py:{append_line})"
    assert says(found["evidence"], "grad_fn", "held_by", holders="LeakyRegressor.outputs")
    assert says(found["recommendation"], "detach")
    assert found["first_step"] < found["detected_step"] < 200

    resumed = result["resumed"]
    assert resumed["steps"] == 400  # the count goes on from the checkpoint
    again = [f for f in resumed["findings"] if f["cause"] == "retained_graph"]
    assert len(again) == 1 and place(again[0]) == place(found)  # one finding, seen in both runs
    assert again[0]["first_step"] == found["first_step"] and again[0]["detected_step"] > 200


# --- a metric kept with its graph in training_step_outputs, detached by the remedy ---------------------

class ProbeKeeper(Regressor):
    """Keeps a per-step error on a fixed probe batch, computed with grad and never backpropagated, in
    `self.training_step_outputs` for the epoch end: each kept tensor holds the probe's activations."""

    def __init__(self) -> None:
        super().__init__()
        self.training_step_outputs = []
        generator = torch.Generator().manual_seed(1)
        self.probe_x, self.probe_y = torch.randn(512, 64, generator=generator), torch.randn(512, 1, generator=generator)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.training_step_outputs.append(F.mse_loss(self.net(self.probe_x), self.probe_y))  # the leak
        return F.mse_loss(self.net(x), y)


def probe_errors_kept(steps: int) -> dict:
    quiet()
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    L.seed_everything(0, verbose=False)
    doctor = LeakDoctorCallback(remedies="all", verbose=False, overhead=1.0)  # every step: what, not pacing
    model = ProbeKeeper()
    trainer = L.Trainer(max_steps=steps, callbacks=[doctor], logger=False, **trainer_options())
    trainer.fit(model, loader(steps))
    kept = model.training_step_outputs
    return {"summary": doctor.summary.to_dict(), "kept": len(kept), "with_graph": sum(t.grad_fn is not None for t in kept),
            "line": ProbeKeeper.training_step.__code__.co_firstlineno + 2}


def test_outputs_kept_with_graphs_are_detached_in_place_and_memory_stops_growing():
    result = isolated(probe_errors_kept, 240)
    summary = result["summary"]
    found = finding(summary, "retained_graph")
    assert found["metric"] == "rss_bytes"  # what leaks, and what the remedy is judged on
    assert place(found) == f"ProbeKeeper.training_step_outputs (tests/test_lightning.py:{result['line']})"
    remedy = found["remedy"]
    assert remedy["name"] == "detach_retained" and remedy["effective"] is True, remedy
    assert remedy["rate_after"] <= 0.1 * found["rate_per_step"], remedy
    assert result["kept"] == 240 and result["with_graph"] == 0  # the module's list is intact, its graphs freed
    # the list still grows, by a detached number per step: a history, no finding (the note it once got
    # is gone: a count growing with nothing behind it raises no suspicion), so the remedied graphs are
    # the run's only finding that counts
    assert not [f for f in summary["findings"] if f["metric"].startswith("len(")], summary["findings"]
    assert [f["cause"] for f in summary["findings"] if counts(f)] == ["retained_graph"], summary["findings"]
    assert summary["verdict"] == "remedied"


# --- construction ---------------------------------------------------------------------------------

def test_bad_arguments_fail_at_construction():
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    with pytest.raises(ValueError, match="remedies"):
        LeakDoctorCallback(remedies="most")
    with pytest.raises(ValueError, match="window"):
        LeakDoctorCallback(window=0)
    with pytest.raises(ValueError, match="log_prefix"):
        LeakDoctorCallback(log_prefix="")
    with pytest.raises(ValueError, match="watch_model"):
        LeakDoctorCallback(watch_model=None)


def test_callback_is_a_lightning_callback():
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    assert issubclass(LeakDoctorCallback, L.Callback)
    callback = LeakDoctorCallback(remedies="safe")
    assert callback.state_key == "LeakDoctorCallback"
    assert callback.summary.steps == 0 and callback.summary.verdict == "unwatched"  # before fit: nothing watched
    copy = pickle.loads(pickle.dumps(callback))  # as ddp_spawn sends it to its processes
    assert type(copy) is LeakDoctorCallback and copy.state_dict() == {}


# --- one callback, several fits (issue #15) -------------------------------------------------------------

def three_fits(steps: int, folder: str) -> dict:
    """One callback through three fits (new Trainers): a module that keeps its losses, then two clean
    ones; the summary file after each fit."""
    quiet()
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    L.seed_everything(0, verbose=False)
    path = Path(folder) / "leaks.json"
    callback = LeakDoctorCallback(verbose=False, overhead=1.0, summary_path=path)  # every step sampled
    written = []
    for module in (LeakyRegressor(), Regressor(), Regressor()):
        trainer = L.Trainer(max_steps=steps, callbacks=[callback], logger=False, **trainer_options())
        trainer.fit(module, loader(steps))
        written.append(json.loads(path.read_text()))
    return {"written": written, "summary": json.loads(callback.summary.to_json())}


def test_a_second_fit_continues_the_callbacks_history(tmp_path):
    result = isolated(three_fits, 150, str(tmp_path))
    first, second, third = result["written"]
    assert [first["steps"], second["steps"], third["steps"]] == [150, 300, 450]  # steps count on
    found = finding(first, "retained_graph")
    assert found["first_step"] < 150
    for later in (second, third):  # the clean fits neither drop nor restart what fit 1 found
        assert later["verdict"] == "leak" and finding(later, "retained_graph") == found
        assert says(later["notes"], "earlier_fits", steps=later["steps"] - 150), later["notes"]
    assert result["summary"]["findings"] == third["findings"]


# --- options and warnings as errors (issue #15) -------------------------------------------------------------

def test_a_misspelt_option_names_itself_and_the_valid_ones():
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    with pytest.raises(ValueError, match=r"unknown option 'remedys': did you mean 'remedies'\? \(valid options: .*watch_model"):
        LeakDoctorCallback(remedys="safe")
    with pytest.raises(ValueError, match="integrations="):
        LeakDoctorCallback(integrations=["not an integration"])


def probe_that_breaks():
    from leakdoctor.integrations import FunctionProbe, Integration, MetricSpec

    def read():
        raise RuntimeError("the probe broke")

    return Integration("broken", probes=[FunctionProbe("broken", read, {"broken": MetricSpec("broken")})])


def fit_with_warnings_as_errors(steps: int, folder: str) -> dict:
    """A fit whose callback has a probe that fails, with LeakDoctorWarning made an error."""
    quiet()
    from leakdoctor import LeakDoctorWarning
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    warnings.simplefilter("error", LeakDoctorWarning)
    path = Path(folder) / "leaks.json"
    callback = LeakDoctorCallback(verbose=False, summary_path=path, integrations=[probe_that_breaks()])
    trainer = L.Trainer(max_steps=steps, callbacks=[callback], logger=False, **trainer_options())
    trainer.fit(Regressor(), loader(steps))
    return json.loads(path.read_text())


def test_a_failing_probe_under_warnings_as_errors_does_not_stop_the_fit(tmp_path):
    summary = isolated(fit_with_warnings_as_errors, 50, str(tmp_path))
    assert summary["steps"] == 50 and [e["part"] for e in summary["errors"]] == ["probe broken"]
