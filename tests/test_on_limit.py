"""on_limit: real runs, each in a fresh process (tests/helpers.isolated) with a real limit a few hundred MiB
above its resident memory, whose leak no remedy can stop (remedies off). With on_limit="stop" a plain
torch loop, a Lightning fit and a Keras fit end before the limit with a checkpoint that loads (the
Lightning one resumed with Trainer.fit(ckpt_path=...)); "warn" warns with the projected step, and again
closer; a callable that raises is reported once; a cache that fills and stays bounded is never stopped.
Argument checks and oom_snapshot on CPU run in this process."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import counts, isolated, says

from leakdoctor import LeakDoctor, LeakDoctorWarning

MIB = 2**20
HEADROOM = 300 * MIB
CHUNK = 2**18  # float64 items: 2 MiB a step


def rss() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss)


def assert_stopped_before_the_limit(summary: dict, limit: float) -> dict:
    stopped = summary["stopped"]
    assert summary["verdict"] == "leak", summary["findings"]
    assert summary["memory_limit"]["bytes"] == limit and summary["memory_limit"]["source"] == "user"
    assert summary["series"]["rss_bytes"]["peak"] < limit
    assert stopped["step"] < summary["projected_limit_step"]
    assert "projected to reach the memory limit" in stopped["reason"] and "not remedied" in stopped["reason"]
    return stopped


# --- a plain torch loop ------------------------------------------------------------------------------

def torch_loop(folder: str, steps: int = 2000) -> dict:
    import torch

    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    saves = []

    def save() -> str:
        path = os.path.join(folder, "model.pt")
        torch.save(model.state_dict(), path)
        saves.append(path)
        return path

    limit = rss() + HEADROOM
    with TorchDoctor(model=model, optimizer=optimizer, memory_limit=limit, on_limit="stop", checkpoint=save,
                    overhead=1.0, verbose=False, summary_path=os.path.join(folder, "leaks.json")) as doctor:
        for step in range(1, steps + 1):
            x = torch.randn(16, 32)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            kept.append(torch.ones(CHUNK, dtype=torch.float64))  # the leak: 2 MiB kept every step
            doctor.step()
            if doctor.should_stop:
                break
    reloaded = torch.load(saves[0]) if saves else None
    return {"limit": limit, "last_step": step, "saves": saves, "should_stop": doctor.should_stop,
            "summary": json.loads(Path(folder, "leaks.json").read_text()),
            "weights_equal": reloaded is not None and torch.equal(reloaded["weight"], model.weight.detach())}


def test_a_torch_loop_stops_before_the_limit_and_saves_through_checkpoint(tmp_path):
    result = isolated(torch_loop, str(tmp_path))
    summary = result["summary"]
    stopped = assert_stopped_before_the_limit(summary, result["limit"])
    assert result["should_stop"] and result["last_step"] == stopped["step"] == summary["steps"] < 2000
    assert result["saves"] == [stopped["checkpoint"]] and result["weights_equal"]  # saved once, as it stopped


# --- Lightning -----------------------------------------------------------------------------------------

def lightning_fit(folder: str) -> dict:
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import lightning.pytorch as L
    import torch
    import torch.nn.functional as F

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    torch.set_num_threads(1)

    class Hoarder(L.LightningModule):
        def __init__(self, hoard: bool = True) -> None:
            super().__init__()
            self.net = torch.nn.Linear(32, 1)
            self.hoard = hoard
            self.kept = []

        def training_step(self, batch, batch_idx):
            if self.hoard:
                self.kept.append(np.ones(CHUNK))  # the leak: a 2 MiB array kept every step
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class FirstStep(L.Callback):
        def __init__(self) -> None:
            self.steps = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.steps.append(trainer.global_step)

    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(3200, 32, generator=generator),
                                          torch.randn(3200, 1, generator=generator))
    options = dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, logger=False, default_root_dir=folder)
    L.seed_everything(0, verbose=False)
    limit = rss() + HEADROOM
    doctor = LeakDoctorCallback(on_limit="stop", memory_limit=limit, overhead=1.0, verbose=False,
                                summary_path=Path(folder) / "leaks.json")
    trainer = L.Trainer(max_steps=5000, callbacks=[doctor], **options)
    trainer.fit(Hoarder(), torch.utils.data.DataLoader(data, batch_size=16))
    summary = json.loads((Path(folder) / "leaks.json").read_text())
    stopped_at = trainer.global_step

    seen = FirstStep()
    again = L.Trainer(max_steps=stopped_at + 20, callbacks=[seen, LeakDoctorCallback(verbose=False)], **options)
    again.fit(Hoarder(hoard=False), torch.utils.data.DataLoader(data, batch_size=16),
              ckpt_path=summary["stopped"]["checkpoint"])
    return {"limit": limit, "summary": summary, "stopped_at": stopped_at, "resumed_from": seen.steps[0],
            "resumed_to": again.global_step, "resumed_steps": len(seen.steps)}


def test_a_lightning_fit_stops_with_a_checkpoint_that_fit_resumes_from(tmp_path):
    result = isolated(lightning_fit, str(tmp_path))
    summary = result["summary"]
    stopped = assert_stopped_before_the_limit(summary, result["limit"])
    assert stopped["checkpoint"] == str(tmp_path / "checkpoints" / f"leakdoctor-stop-step={stopped['step']}.ckpt")
    assert result["stopped_at"] == stopped["step"] == summary["steps"] < 5000  # ended on the step it decided
    assert result["resumed_from"] == stopped["step"] and result["resumed_steps"] == 20
    assert result["resumed_to"] == stopped["step"] + 20


# --- Keras -----------------------------------------------------------------------------------------------

def keras_fit(folder: str) -> dict:
    os.environ["KERAS_BACKEND"] = "torch"
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    import keras

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    class Hoarder(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.kept = []

        def on_train_batch_end(self, batch, logs=None):
            self.kept.append(np.ones(CHUNK))  # the leak: a 2 MiB array kept every batch

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 16)).astype("float32")
    y = x[:, :1] * 0.5
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    weights_at_save = []
    limit = rss() + HEADROOM
    with LeakDoctorCallback(on_limit="stop", memory_limit=limit, overhead=1.0, verbose=False,
                            summary_path=Path(folder) / "leaks.json",
                            checkpoint=lambda: weights_at_save.append(model.get_weights())) as doctor:
        history = model.fit(x, y, batch_size=16, epochs=100, verbose=0, callbacks=[doctor, Hoarder()])
    summary = json.loads((Path(folder) / "leaks.json").read_text())
    loaded = keras.models.load_model(summary["stopped"]["checkpoint"])
    same = all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), weights_at_save[0]))
    return {"limit": limit, "summary": summary, "epochs": len(history.history["loss"]), "same_weights": same,
            "predicts": bool(np.isfinite(loaded.predict(x[:4], verbose=0)).all())}


def test_a_keras_fit_stops_with_a_saved_model_that_loads(tmp_path):
    result = isolated(keras_fit, str(tmp_path))
    summary = result["summary"]
    stopped = summary["stopped"]
    assert summary["verdict"] == "leak" and summary["memory_limit"]["source"] == "user"
    assert stopped["call"] == 1 and stopped["reason"].startswith("fit() call 1 at ")  # the first call
    assert stopped["step"] == stopped["batch"]  # on the clock of batches: the first fit's batch
    assert stopped["checkpoint"] == str(tmp_path / f"leakdoctor-stop-fit1-batch{stopped['batch']}.keras")
    assert result["epochs"] < 100  # the fit ended early, at the end of the batch after the decision
    assert result["same_weights"] and result["predicts"]  # the model as it was when the doctor stopped
    assert summary.get("stopped_by") is None  # one process
    assert says(summary["notes"], "stop_warns_across_calls"), summary["notes"]  # the loop of calls is the user's


# --- warn, a callable, and a cache that stays bounded -------------------------------------------------

def numpy_loop(steps: int, on_limit: str, stop_short: float = 0.0, cache: int = 0) -> dict:
    """A loop keeping a 2 MiB array every step (all of them, or the last `cache`), with a limit 300 MiB
    above its start; with `stop_short`, the loop itself ends that close to the limit (it would die)."""
    from collections import OrderedDict

    warnings.simplefilter("always", LeakDoctorWarning)
    limit = rss() + HEADROOM
    kept: OrderedDict[int, np.ndarray] = OrderedDict()
    received = []

    def act(summary) -> None:
        received.append((summary.steps, [f.cause for f in summary.leaks]))
        raise RuntimeError("pager unreachable")

    action = act if on_limit == "callable" else on_limit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LeakDoctorWarning)
        doctor = LeakDoctor(memory_limit=limit, on_limit=action, overhead=1.0, verbose=False)
        for step in range(1, steps + 1):
            kept[step] = np.ones(CHUNK)
            if cache and len(kept) > cache:
                kept.popitem(last=False)
            doctor.step()
            if doctor.should_stop or (stop_short and rss() > limit - stop_short):
                break
        summary = doctor.finish()
    ours = [w for w in caught if issubclass(w.category, LeakDoctorWarning)]
    return {"summary": summary.to_dict(), "last_step": step, "received": received, "should_stop": doctor.should_stop,
            "warnings": [str(w.message) for w in ours], "where": sorted({f"{w.filename}:{w.lineno}" for w in ours})}


STEP_LINE = numpy_loop.__code__.co_firstlineno + 22


def test_warn_says_the_projected_step_once_and_again_closer_and_never_stops():
    result = isolated(numpy_loop, 1000, "warn", stop_short=20 * MIB)
    warned = result["warnings"]
    assert not result["should_stop"] and "stopped" not in result["summary"]
    assert len(warned) >= 2 and len(warned) == len(set(warned)), warned  # each once, no repeats
    steps_left = [int(w.split(", in ")[1].split(" steps")[0]) for w in warned]
    assert steps_left[1] <= steps_left[0] / 4  # again when much closer
    assert all("rss_bytes is projected to reach the memory limit" in w and ", user) at step " in w for w in warned)
    assert "within the margin" in warned[-1] and "on_limit='stop' would end the run" in warned[-1]
    assert result["where"] == [f"{__file__}:{STEP_LINE}"]  # shown at the user's doctor.step(), not in leakdoctor


def test_a_callable_receives_the_summary_so_far_and_its_error_is_reported_once():
    result = isolated(numpy_loop, 1000, "callable", stop_short=20 * MIB)
    assert len(result["received"]) == 1  # called once, at the margin
    steps, causes = result["received"][0]
    assert causes == ["python_objects"] and steps < result["last_step"] + 1
    summary = result["summary"]
    assert [e for e in summary["errors"] if e["part"] == "on_limit"] == [
        {"part": "on_limit", "error": "RuntimeError: pager unreachable"}]
    assert not result["should_stop"] and "stopped" not in summary and summary["verdict"] == "leak"


def test_a_cache_that_fills_and_stays_bounded_is_not_stopped():
    # 100 entries of 2 MiB: 200 MiB of the 300 MiB headroom, then no growth for 500 steps. The filling is
    # seen and projected (a warning), and by step 600 the margin (60 steps) is wider than the distance to
    # the limit at the old rate (about 50 steps); a stop needs growth that goes on, and this one stopped.
    result = isolated(numpy_loop, 600, "stop", cache=100)
    assert any("projected to reach the memory limit" in w for w in result["warnings"])
    assert result["last_step"] == 600 and not result["should_stop"]
    assert "stopped" not in result["summary"] and not any("stopping the run" in w for w in result["warnings"])


class Cycle:
    """2 MiB in a reference cycle: garbage that only the garbage collector frees."""

    def __init__(self) -> None:
        self.data = np.ones(CHUNK)
        self.me = self


def cycles_loop(remedies: str, steps: int = 400) -> dict:
    """Cycles of garbage every step with the garbage collector off: a leak gc_collect can remedy."""
    import gc

    gc.disable()
    limit = rss() + HEADROOM
    doctor = LeakDoctor(memory_limit=limit, on_limit="stop", remedies=remedies, overhead=1.0, verbose=False)
    for step in range(1, steps + 1):
        Cycle()
        doctor.step()
        if doctor.should_stop:
            break
    return {"last_step": step, "summary": doctor.finish().to_dict()}


def test_a_remedied_leak_is_not_stopped_and_the_same_leak_unremedied_is():
    unremedied = isolated(cycles_loop, "off")["summary"]
    remedied = isolated(cycles_loop, "safe")
    assert unremedied["stopped"]["step"] < 400 and unremedied["verdict"] == "leak"
    summary = remedied["summary"]
    (finding,) = [f for f in summary["findings"] if counts(f)]
    assert finding["remedy"]["name"] == "gc_collect" and finding["remedy"]["effective"] is True
    assert remedied["last_step"] == 400 and "stopped" not in summary and summary["verdict"] == "remedied"


# --- arguments -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"on_limit": "halt"}, "on_limit='halt': expected 'warn', 'stop', or a callable"),
    ({"on_limit": None}, "on_limit=None"),
    ({"limit_margin": -1}, "limit_margin=-1: expected steps"),
    ({"limit_margin": 1.5}, "limit_margin=1.5"),
    ({"limit_margin": True}, "limit_margin=True"),
    ({"limit_margin": "10%"}, "limit_margin='10%'"),
    ({"checkpoint": "model.pt"}, "checkpoint='model.pt': expected a callable"),
    ({"oom_snapshot": 3}, "oom_snapshot=3: expected a file path"),
])
def test_bad_on_limit_arguments_fail_at_construction(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        LeakDoctor(**options)


def test_bad_on_limit_arguments_fail_in_the_callbacks_too():
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    with pytest.raises(ValueError, match="on_limit='never'"):
        LeakDoctorCallback(on_limit="never")
    with pytest.raises(ValueError, match="limit_margin=0.0"):
        LeakDoctorCallback(limit_margin=0.0)


def test_oom_snapshot_on_cpu_records_nothing_and_says_so(tmp_path):
    import torch

    assert not torch.cuda.is_available()  # this suite runs on CPU; on CUDA the snapshot is recorded
    path = tmp_path / "oom.pickle"
    doctor = LeakDoctor(oom_snapshot=path, verbose=False)
    for _ in range(30):
        doctor.step()
    summary = doctor.finish(MemoryError("out of memory"))
    assert summary.oom is not None and "snapshot" not in summary.oom and not path.exists()
    assert says(summary.notes, "no_cuda_snapshot", path=repr(str(path))), summary.notes


def test_every_loop_doctor_takes_the_on_limit_options_and_starts_not_stopped():
    from leakdoctor.callbacks.jax import LeakDoctor as FlaxDoctor
    from leakdoctor.callbacks.mlx import LeakDoctor as MlxDoctor
    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    for make in (LeakDoctor, TorchDoctor, FlaxDoctor, MlxDoctor):
        doctor = make(on_limit="stop", limit_margin=50, checkpoint=lambda: "saved", verbose=False)
        for _ in range(30):
            doctor.step()
        assert doctor.should_stop is False and doctor.settings.on_limit == "stop", make
        assert doctor.finish().stopped is None


# --- a suspicion is no warning -------------------------------------------------------------------------

def lru_loop(steps: int = 600, maxsize: int = 300) -> dict:
    """A bounded functools.lru_cache of 256 kB values: it fills for `maxsize` steps, then stays bounded."""
    import functools

    @functools.lru_cache(maxsize=maxsize)
    def features(i: int) -> np.ndarray:
        return np.full(2**15, float(i))  # 256 kB a new key

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LeakDoctorWarning)
        doctor = LeakDoctor(verbose=False)
        for step in range(steps):
            features(step)
            doctor.step()
        summary = doctor.finish()
    return {"summary": summary.to_dict(), "currsize": features.cache_info().currsize,
            "warnings": [str(w.message) for w in caught if issubclass(w.category, LeakDoctorWarning)]}


def test_a_bounded_lru_cache_gets_no_warning_and_a_clean_verdict():
    # The filling (75 MB over 300 steps) looks like a leak while it goes on; projected to the limit at the
    # RAM's tens of thousands of steps on, it was warned about as one and then withdrawn by the summary.
    result = isolated(lru_loop)
    assert result["currsize"] == 300
    assert result["warnings"] == []
    summary = result["summary"]
    assert summary["verdict"] == "clean" and not [f for f in summary["findings"] if counts(f)], summary["findings"]
