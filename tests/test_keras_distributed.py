"""A multi-process Keras run (KERAS_BACKEND=jax, jax.distributed.initialize, two processes on CPU): with
on_limit="stop" every process's fit stops at the same batch. Each process fits a small model of its own
over synthetic data with the callback; only process 1 leaks (a callback keeps 2 MiB a batch in a list of
the model, which the fit's doctor watches), with a real limit a few hundred MiB above its resident memory:
process 1 asks to stop, the fits' doctors agree (one multihost_utils.process_allgather at agreement
batches), and both set model.stop_training at the same batch, before the limit. Process 0 alone saves the
model; it writes leaks.json, process 1 its own leaks.rank1.json beside it, and both say which process
asked. The two processes are spawned from this test, with a deadline after which both are killed.

And a process that the environment says is one of several (RANK, WORLD_SIZE) with no distributed runtime
initialized: no collective to agree through, so on_limit="stop" acts as "warn" (the fit runs to its end)
and the summary's notes say so."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import isolated, says

from test_distributed_stop import CHUNK, HEADROOM, rss, run_ranks

pytest.importorskip("jax")
if importlib.util.find_spec("keras") is None:  # importing keras here would pick its backend for this process
    pytest.skip("needs keras", allow_module_level=True)

BATCH = 16
EPOCHS, PER_EPOCH = 20, 60
STEPS = EPOCHS * PER_EPOCH  # the training batches of a fit that nothing stops
TIMEOUT = 120  # seconds for both processes, then they are killed


def keras_process(rank: int, port: int, folder: str, conn: Any) -> None:
    """One of two JAX processes fitting with the callback; process 1 keeps 2 MiB a batch."""
    try:
        conn.send(("ok", _keras_process(rank, port, folder)))
    except BaseException as err:  # noqa: BLE001 - hand every failure back to the test
        import traceback

        conn.send(("error", f"process {rank}: {type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def _keras_process(rank: int, port: int, folder: str) -> dict:
    _jax_on_cpu()
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank)
    try:
        return {"rank": rank, **fit_with_a_leak(folder, leak=rank == 1, epochs=EPOCHS)}
    finally:
        jax.distributed.shutdown()


def _jax_on_cpu() -> None:
    os.environ.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
                      XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import warnings

    warnings.filterwarnings("ignore")


def fit_with_a_leak(folder: str, leak: bool, epochs: int) -> dict:
    """A subclassed model (its list `hoard` watched by the fit's doctor) fitted for `epochs` of PER_EPOCH
    batches with LeakDoctorCallback(on_limit="stop"); if `leak`, a callback appends 2 MiB to the list every
    batch. The batches trained, the limit, the resident memory at the end, and the summary."""
    import keras

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    class Hoarded(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.out = keras.layers.Dense(1)
            self.hoard = []

        def call(self, x):
            return self.out(self.hidden(x))

    class Hoarder(keras.callbacks.Callback):
        def __init__(self, keeper: Any) -> None:
            super().__init__()
            self.keeper, self.batches = keeper, 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            if leak:
                self.keeper.hoard.append(np.ones(CHUNK))  # the leak: 2 MiB kept every batch

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(BATCH * PER_EPOCH, 16)).astype("float32")
    y = x[:, :1] * 0.5
    model = Hoarded()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # compiled before the limit is set
    hoarder = Hoarder(model)
    limit = rss() + HEADROOM
    with LeakDoctorCallback(on_limit="stop", memory_limit=limit, overhead=1.0, verbose=False,
                            summary_path=Path(folder) / "leaks.json") as doctor:
        model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=[doctor, hoarder])
        end = rss()
    return {"batches": hoarder.batches, "stop_training": model.stop_training, "limit": limit, "rss": end,
            "summary": doctor.summary.to_dict()}


def test_two_keras_processes_stop_their_fits_at_the_same_batch_when_one_leaks(tmp_path):
    results = run_ranks(keras_process, str(tmp_path), timeout=TIMEOUT)
    batches = [r["batches"] for r in results]
    assert batches[0] == batches[1] < STEPS and all(r["stop_training"] for r in results), batches
    # process 0's own summary: the stop, which process asked, and the model it alone saved
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["rank"] == 0 and summary["framework"] == "keras"
    stopped = summary["stopped"]
    assert stopped["call"] == 1 and stopped["batch"] <= batches[0]  # the first fit; Keras ends the batch it began
    assert stopped["step"] == stopped["batch"]  # on the clock of batches: the first fit's
    assert summary["stopped_by"]["rank"] == 1
    saved = tmp_path / f"leakdoctor-stop-fit1-batch{stopped['batch']}.keras"
    assert stopped["checkpoint"] == str(saved) and saved.is_file()
    # process 1's own summary beside it: its leak, found and stopped before its limit, at the same batch
    own = json.loads((tmp_path / "leaks.rank1.json").read_text())
    assert own["rank"] == 1 and own["verdict"] == "leak"
    assert own["stopped"]["batch"] == stopped["batch"] and own["stopped"]["checkpoint"] is None
    assert own["stopped_by"]["rank"] == 1 and own["stopped_by"]["batch"] <= stopped["batch"]
    assert any(f["state"] == "leak" for f in own["findings"]), own["findings"]
    assert own["series"]["rss_bytes"]["peak"] < results[1]["limit"] and results[1]["rss"] < results[1]["limit"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["leaks.json", "leaks.rank1.json", saved.name])


def one_of_several_without_a_collective(folder: str, epochs: int) -> dict:
    """A fit that leaks in a process whose environment says it is rank 1 of 2, with no distributed runtime."""
    os.environ.update(RANK="1", WORLD_SIZE="2")
    _jax_on_cpu()
    return fit_with_a_leak(folder, leak=True, epochs=epochs)


def test_without_a_collective_stop_acts_as_warn_and_the_summary_says_so(tmp_path):
    epochs = 4  # 240 batches: 480 MiB kept, past the 300 MiB of headroom
    result = isolated(one_of_several_without_a_collective, str(tmp_path), epochs, timeout=TIMEOUT)
    summary = result["summary"]
    assert result["batches"] == epochs * PER_EPOCH and not result["stop_training"]  # the fit ran to its end
    assert summary["verdict"] == "leak" and any(f["state"] == "leak" for f in summary["findings"])
    assert summary.get("stopped") is None and summary.get("stopped_by") is None
    assert says(summary["notes"], "stop_warns_in_fits", variable="WORLD_SIZE=2"), summary["notes"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaks.json"]  # nothing saved
