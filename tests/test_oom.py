"""Out-of-memory post-mortems from runs that really run out of memory: a numpy loop under a real
RLIMIT_AS in a fresh process (tests/helpers.isolated), once with a leak fast enough that an investigation
names the allocating line before the end, once dying before any investigation (the growing series is
still named); a Lightning fit and a Keras fit that die of a real MemoryError (the callbacks' exception
paths); and the errors the frameworks really raise when an allocation fails, recognised or not."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import counts, isolated, phrase, says, place

from leakdoctor import LeakDoctor
from leakdoctor._lifecycle.oom import is_oom

HERE = Path(__file__)
MIB = 2**20
IMPOSSIBLE = 2**50  # float64 items: 8 PiB, an allocation that fails at once


def line_of(marker: str) -> int:
    """The line in this file that carries `# <marker>`."""
    return next(i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {marker}"))


def numpy_until_oom(folder: str, chunk_mib: int, headroom_mib: int, **options) -> dict:
    """Keep a `chunk_mib` MiB array every step under RLIMIT_AS set `headroom_mib` MiB above the current
    virtual size, until numpy's allocation fails; the summary written on the way out."""
    import resource

    import psutil

    vms = psutil.Process().memory_info().vms
    resource.setrlimit(resource.RLIMIT_AS, (vms + headroom_mib * MIB, resource.getrlimit(resource.RLIMIT_AS)[1]))
    path = Path(folder) / "leaks.json"
    kept = []
    raised = None
    try:
        with LeakDoctor(summary_path=path, verbose=False, **options) as doctor:
            for _ in range(10_000):
                kept.append(np.ones(chunk_mib * MIB // 8))  # allocation
                doctor.step()
    except MemoryError as err:
        raised = type(err).__name__
    return {"raised": raised, "steps": len(kept), "summary": json.loads(path.read_text())}


def test_a_run_out_of_memory_names_the_growing_line_an_investigation_saw(tmp_path):
    # 8 MiB a step and 600 MiB of address space: an investigation (warm-up 5, windows of 3, every step
    # sampled) concludes around step 31, well before the allocation fails around step 70.
    result = isolated(numpy_until_oom, str(tmp_path), 8, 600, warmup=5, window=3, overhead=1.0)
    summary = result["summary"]
    assert result["raised"] == "MemoryError"
    oom = summary["oom"]
    assert oom["step"] == summary["steps"] == result["steps"]  # the steps whose allocation succeeded
    assert oom["error"].startswith("MemoryError: Unable to allocate 8.00 MiB")
    site = f"tests/{HERE.name}:{line_of('allocation')}"
    assert oom["sites"][0]["location"] == site and oom["sites"][0]["seen_by"] == "tracemalloc"
    assert oom["sites"][0]["bytes"] >= 8 * MIB
    assert oom["growing"][0]["metric"] == "rss_bytes"
    assert 7 * MIB < oom["growing"][0]["slope_per_step"] < 9 * MIB
    assert any(place(f) == site and counts(f) for f in summary["findings"])  # a finding too
    limit = summary["memory_limit"]
    assert limit["source"] == "rlimit" and limit["detail"].startswith("RLIMIT_AS")  # the tightest limit
    # RLIMIT_AS is compared with the address space, where the run died: its last reading lies within a chunk
    # or two of the limit
    assert limit["figure"] == "vms_bytes"
    assert abs(summary["series"]["vms_bytes"]["peak"] - limit["bytes"]) < 2 * 8 * MIB


def test_a_run_that_dies_before_any_investigation_still_names_what_grew(tmp_path):
    # 16 MiB a step and 250 MiB: the allocation fails around step 15, inside the default warm-up of 20.
    result = isolated(numpy_until_oom, str(tmp_path), 16, 250, overhead=1.0)
    summary = result["summary"]
    oom = summary["oom"]
    assert result["raised"] == "MemoryError" and oom["step"] < 20
    assert summary["findings"] == [] and oom["sites"] == []  # nothing was investigated
    assert oom["growing"][0]["metric"] == "rss_bytes" and 15 * MIB < oom["growing"][0]["slope_per_step"] < 17 * MIB
    assert says(summary["notes"], "ended", error="MemoryError", step=oom["step"]), summary["notes"]


# --- the callbacks' exception paths ---------------------------------------------------------------------

def lightning_dies(folder: str) -> dict:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    import lightning.pytorch as L
    import torch

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    class Dies(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 30:
                np.ones(IMPOSSIBLE)
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(640, 8))
    trainer = L.Trainer(max_steps=40, callbacks=[LeakDoctorCallback(summary_path=Path(folder) / "leaks.json",
                                                                    verbose=False)],
                        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    try:
        trainer.fit(Dies(), torch.utils.data.DataLoader(data, batch_size=16))
    except MemoryError:
        pass
    return json.loads((Path(folder) / "leaks.json").read_text())


def test_lightning_records_the_oom_its_fit_died_of(tmp_path):
    summary = isolated(lightning_dies, str(tmp_path))
    assert summary["oom"]["step"] == 30 and summary["oom"]["error"].startswith("MemoryError: Unable to allocate")


def keras_dies(folder: str) -> dict:
    os.environ["KERAS_BACKEND"] = "torch"
    warnings.filterwarnings("ignore")
    import keras

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    class Dies(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 12:
                np.ones(IMPOSSIBLE)

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((320, 8), "float32")
    try:
        with LeakDoctorCallback(summary_path=Path(folder) / "leaks.json", verbose=False) as doctor:
            model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0, callbacks=[doctor, Dies()])
    except MemoryError:
        pass
    return json.loads((Path(folder) / "leaks.json").read_text())


def test_keras_records_the_oom_its_fit_died_of(tmp_path):
    summary = isolated(keras_dies, str(tmp_path))
    oom = summary["oom"]
    # steps are training batches (issue #38's one clock): the fit died in call 1, at its batch 13
    assert oom["call"] == 1 and oom["error"].startswith("MemoryError: Unable to allocate")
    assert oom["batch"] == 13  # batches 0-12 trained; the 13th died in its batch-end hook, after its step


# --- recognising the error ---------------------------------------------------------------------------

def raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as err:  # noqa: BLE001 - the test inspects what the framework raised
        return err
    raise AssertionError("no error")


def test_the_frameworks_allocation_failures_are_recognised():
    import jax.numpy as jnp
    import torch

    numpy_error = raised(lambda: np.ones(IMPOSSIBLE))
    torch_error = raised(lambda: torch.empty(IMPOSSIBLE))  # DefaultCPUAllocator: can't allocate memory
    jax_error = raised(lambda: jnp.ones(2**40).block_until_ready())  # RESOURCE_EXHAUSTED
    assert isinstance(torch_error, RuntimeError) and "can't allocate memory" in str(torch_error)
    assert "RESOURCE_EXHAUSTED" in str(jax_error)
    for error in (numpy_error, torch_error, jax_error, MemoryError(), OSError(12, "Cannot allocate memory")):
        assert is_oom(error), repr(error)
    try:  # an OOM raised again as another error still counts
        try:
            np.ones(IMPOSSIBLE)
        except MemoryError as err:
            raise ValueError("batch failed") from err
    except ValueError as wrapped:
        assert is_oom(wrapped)


def test_other_errors_are_not_out_of_memory():
    import torch

    shape_error = raised(lambda: torch.ones(3) @ torch.ones(4))
    for error in (shape_error, raised(lambda: np.ones(3)[5]), KeyboardInterrupt(), RuntimeError("data went bad"),
                  OSError(2, "No such file or directory")):
        assert not is_oom(error), repr(error)


def test_no_oom_entry_without_an_oom(tmp_path):
    doctor = LeakDoctor(verbose=False)
    for _ in range(30):
        doctor.step()
    summary = doctor.finish(RuntimeError("data went bad"))
    assert summary.oom is None and "oom" not in summary.to_dict()
    assert says(summary.notes, "ended", error="RuntimeError", step=30), summary.notes


@pytest.mark.parametrize("kind", ["stopped", "oom"])
def test_the_text_summary_says_how_the_run_ended_first(kind):
    from leakdoctor.reporting.summary import Summary

    entry = {"stopped": {"step": 140, "reason": "rss_bytes is projected to reach the memory limit",
                         "checkpoint": "a.ckpt"},
             "oom": {"step": 70, "error": "MemoryError: Unable to allocate 8.00 MiB",
                     "growing": [{"metric": "rss_bytes", "slope_per_step": 8 * MIB, "since_step": 1, "end": 5e8}],
                     "sites": [{"location": "train.py:12", "bytes": 6e7, "count": 7, "seen_by": "tracemalloc",
                                "step": 31, "user": True}]}}[kind]
    summary = Summary("python", 140, {}, [], **{kind: entry})
    first = summary.text().splitlines()[0]
    if kind == "stopped":
        assert phrase("stopped_line", step=140, reason=entry["reason"]).fullmatch(first), first
        assert summary.verdict == "leak"
    else:
        assert phrase("oom_line", step=70, error=entry["error"]).fullmatch(first), first
        assert says(summary.text(), "oom_growing", metric="rss_bytes", rate="8.0 MiB", since=1), summary.text()
        assert says(summary.text(), "oom_allocated", location="train.py:12", what="7 allocations", size="57.2 MiB",
                    seen_by="tracemalloc", step=31), summary.text()
    again = Summary.from_dict(json.loads(summary.to_json()))
    assert getattr(again, kind) == entry and again.text() == summary.text()
