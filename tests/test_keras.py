"""LeakDoctorCallback in real Keras 3 runs on the jax and the torch backend, each scenario in a fresh
process (tests/helpers.isolated) whose KERAS_BACKEND is set before keras is imported: 40 models built and
fitted in a loop with one reused callback (found across calls, cured by clear_session under
remedies="all"), a clean fit of 20 epochs (no finding, memory columns in a real CSVLogger file, the same
losses, weights and predictions as without the callback), predict in a loop on inputs of changing shape
(jax retraces: compile_cache; torch does not), a model keeping its activations within one fit (the batch
clock), a fit that raises; and, in one process since they measure no memory, clear_session keeping the
user's settings and bad arguments."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import counts, has, isolated, kept, mentions, phrase, place, says

from leakdoctor._base.trend import theil_sen

HERE = Path(__file__)
BACKENDS = ("jax", "torch")
#: Fixed so that materiality (growth against the headroom to the limit) does not depend on the RAM of
#: the machine running the tests.
LIMIT = "4GiB"


def line_of(marker: str) -> int:
    """The line in this file that carries `# <marker>`."""
    return next(i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {marker}"))


def site(marker: str) -> str:
    return f"tests/{HERE.name}:{line_of(marker)}"


def keras_on(backend: str) -> Any:
    """Keras on `backend`, in this (fresh) process, quietly and on one thread."""
    os.environ["KERAS_BACKEND"] = backend
    import warnings

    warnings.filterwarnings("ignore")
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    import keras

    assert keras.config.backend() == backend
    return keras


def regression_data(rows: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)).astype("float32")
    return x, (x[:, :1] * 0.5 + 0.1 * rng.normal(size=(rows, 1))).astype("float32")


def finding(summary: dict, cause: str) -> dict:
    """The leak (not benign) finding of this cause."""
    found = [f for f in summary["findings"] if f["cause"] == cause and counts(f)]
    assert found, f"no {cause} finding in {[(f['cause'], f['metric']) for f in summary['findings']]}; notes {summary['notes']}"
    return found[0]


# --- models built in a loop ---------------------------------------------------------------------------

def models_in_a_loop(backend: str, fits: int, folder: str, clear: bool = False, limit: str = LIMIT,
                     remedies: str = "all") -> dict:
    """`fits` models built and fitted one after another with one reused callback (`remedies`, `limit`),
    with keras.backend.clear_session() before each model if `clear`; the resident memory after each fit,
    the summary and what was printed."""
    keras = keras_on(backend)
    import psutil

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    x, y = regression_data(256, 64)
    doctor = LeakDoctorCallback(remedies=remedies, memory_limit=limit, summary_path=Path(folder) / "leaks.json")
    process, rss, written = psutil.Process(), [], []
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        for _ in range(fits):
            if clear:
                keras.backend.clear_session()
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                      keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")
            model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[doctor])  # fit-in-loop
            rss.append(process.memory_info().rss)
            written.append(json.loads((Path(folder) / "leaks.json").read_text())["steps"])
        final = doctor.finish()
    return {"summary": final.to_dict(), "rss": rss, "written": written, "printed": printed.getvalue(),
            "settings": doctor.doctor.settings.warmup}


def test_models_piling_up_in_cycles_are_found_on_their_count_where_memory_has_room_to_spare(tmp_path):
    """keras#2102 on a machine with room to spare: against a 1 TiB limit the old models' weights are too
    little to matter in resident memory, yet each model stays in its reference cycles until a full
    collection that Python's own collector does not run here: the count of models alive, which the
    investigation's gc.collect() takes back, proves it."""
    summary = isolated(models_in_a_loop, "torch", 40, str(tmp_path), limit="1TiB", remedies="off")["summary"]
    found = finding(summary, "python_objects")
    assert found["metric"] == "keras_models_alive" and place(found) == site("fit-in-loop")
    assert summary["verdict"] == "leak" and found["state"] == "leak"


@pytest.mark.parametrize("backend", BACKENDS)
def test_models_built_in_a_loop_are_found_across_fits_and_clear_session_stops_the_growth(backend, tmp_path):
    fits = 40
    result = isolated(models_in_a_loop, backend, fits, str(tmp_path))
    summary = result["summary"]
    # one clock: the steps are the training batches (4 a fit), each fit call marked
    assert summary["framework"] == "keras" and summary["steps"] == 4 * fits
    assert [(c["call"], c["kind"], c["first_step"], c["last_step"]) for c in summary["calls"]] == \
        [(n, "fit", 4 * n - 3, 4 * n) for n in range(1, fits + 1)]
    assert result["written"] == list(range(4, 4 * fits + 1, 4))  # the cumulative summary, rewritten after every fit
    found = finding(summary, "python_objects")
    # On jax the models' variables are jax arrays, so the finding may stand on the live bytes jax holds
    # instead: in a window where Python's own collections had already freed most old models, what
    # resident memory gave back came back at malloc_trim (the C heap's cache, left to its own rule), while
    # the arrays of the models still piling up came back at gc.collect(). Both measure the same models.
    assert found["metric"] in ({"rss_bytes", "jax_live_bytes_cpu"} if backend == "jax" else {"rss_bytes"})
    assert place(found) == site("fit-in-loop")
    assert says(found["evidence"], "new_models", "per_new_model")
    # the old models pile up (not kept referenced): in cycles that gc.collect() frees (or Python's own full
    # collection freed just before the ladder's), or not given back
    assert any(says(found["evidence"], key) for key in ("gc_took_back", "collected_then_trimmed", "not_given_back"))
    assert says(found["recommendation"], "clear_session")
    # The models piled up: memory grew by at least half a model per new model (every call brings one).
    model_bytes = summary["series"]["keras_model_bytes"]["end"]
    others = [(f["cause"], f["metric"], f["benign"], f["first_step"], f["rate_per_step"]) for f in summary["findings"]]
    assert 4 * found["rate_per_step"] >= 0.5 * model_bytes, (found, model_bytes, others, summary["notes"])  # per batch
    remedy = found["remedy"]
    assert remedy["name"] == "clear_session" and remedy["effective"] is True, remedy
    assert 4 * remedy["rate_after"] < 0.5 * model_bytes < 4 * found["rate_per_step"], remedy
    assert summary["verdict"] == "remedied", [(f["cause"], f["remedy"]) for f in summary["findings"]]
    # Resident memory measured here, after each fit. Before clear_session it rose above its level after
    # the warm-up by more than two models' worth (on jax in a sawtooth: the investigations' gc.collect()
    # frees the old models, then they pile up again); once clear_session runs between fits it stays below
    # that peak, and what is left grows by less than half a model per fit (the C heap settling, which a
    # loop calling clear_session itself shows too).
    rss = np.asarray(result["rss"], dtype=float)
    applied, warmup = remedy["applied_step"] // 4, result["settings"]  # the fit call it was applied after
    peak = rss[warmup:applied].max()
    assert peak - rss[warmup - 1] >= 2 * model_bytes, (rss[warmup - 1], peak, model_bytes)
    assert rss[applied:].max() < peak, (peak, rss[applied:])
    growth_after = theil_sen(np.arange(applied + 1, fits + 1), rss[applied:])[0]
    assert growth_after < 0.5 * model_bytes, (growth_after, model_bytes)
    # The fits ran with verbose=0: the summary is printed once, at finish(); the findings as they came.
    assert len(phrase("headline", framework="keras", steps=160, verdict="REMEDIED").findall(result["printed"])) == 1
    assert says(result["printed"], "applied", remedy="clear_session", cause="python_objects")


def test_models_built_in_a_loop_with_clear_session_are_clean(tmp_path):
    result = isolated(models_in_a_loop, "torch", 20, str(tmp_path), clear=True)
    summary = result["summary"]
    assert summary["verdict"] == "clean", summary["findings"]
    # Resident memory may creep (the C heap) while the model a new one replaced awaits the next collection:
    # if that is investigated, it is named and found benign, never a leak.
    assert all(f["benign"] and f["cause"] == "python_objects" and says(f["evidence"], "models_settle")
               for f in summary["findings"]), summary["findings"]
    assert summary["steps"] == 80 and summary["series"]["keras_models_seen"]["end"] == 20  # 20 fits of 4 batches


def models_kept_in_a_list(backend: str, fits: int) -> dict:
    """A sweep as users write it (issue #28's keep_models plant): keras.backend.clear_session() before
    each model, one fit each, and every fitted model kept in a list; remedies off."""
    keras = keras_on(backend)
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    x, y = regression_data(256, 64)
    doctor = LeakDoctorCallback(memory_limit=LIMIT, verbose=False)
    models = []
    for _ in range(fits):
        keras.backend.clear_session()
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[doctor])
        models.append(model)  # model-kept
    return {"summary": doctor.finish().to_dict(), "kept": len(models)}


def test_models_kept_in_a_list_are_placed_at_the_append_on_torch():
    summary = isolated(models_kept_in_a_list, "torch", 20)["summary"]
    found = finding(summary, "python_objects")
    assert found["metric"] in ("rss_bytes", "keras_models_alive"), found
    assert place(found) == f"models in models_kept_in_a_list() ({site('model-kept')})", found
    assert found["state"] == "leak" and summary["verdict"] == "leak"
    assert has(found["evidence"], "models_referenced") and has(found["evidence"], "models_held_by", holder="models")


# --- a clean fit --------------------------------------------------------------------------------------

def clean_fit(backend: str, folder: str) -> dict:
    """The same 20-epoch fit and predict with the callback (remedies off, before a CSVLogger) and without."""
    keras = keras_on(backend)
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    x, y = regression_data(320, 32)
    result: dict[str, Any] = {}
    for watched in (True, False):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dropout(0.1), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        logger = keras.callbacks.CSVLogger(str(Path(folder) / f"log{int(watched)}.csv"))
        doctor = LeakDoctorCallback(summary_path=Path(folder) / "leaks.json") if watched else None
        callbacks = [doctor, logger] if doctor else [logger]
        printed, shown = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(shown):
            history = model.fit(x, y, epochs=20, batch_size=32, validation_split=0.2, verbose=2, callbacks=callbacks)
        predictions = model.predict(x, verbose=0, callbacks=[doctor] if doctor else [])
        result["with" if watched else "without"] = {
            "history": history.history, "weights": model.get_weights(), "predictions": predictions}
        if doctor:
            result["printed"] = printed.getvalue()
            final = doctor.finish()
            result["summary"], result["text"] = final.to_dict(), final.text()
            result["file"] = json.loads((Path(folder) / "leaks.json").read_text())
    with open(Path(folder) / "log1.csv") as fh:
        result["csv"] = list(csv.DictReader(fh))
    return result


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_clean_fit_has_no_finding_logs_memory_and_trains_exactly_as_without(backend, tmp_path):
    result = isolated(clean_fit, backend, str(tmp_path))
    summary = result["summary"]
    assert summary["verdict"] == "clean" and kept(summary) == [], summary["findings"]
    # one clock: the steps are the fit's 160 training batches (20 epochs of 8), the fit and the predict marked
    assert summary["steps"] == 160 and result["file"]["steps"] == 160
    assert [(c["kind"], c["first_step"], c["last_step"]) for c in summary["calls"]] == [("fit", 1, 160), ("predict", 160, 160)]
    assert says(summary["notes"][0], "keras_clock", calls=2, batches=160)
    assert "watched 160 steps" in result["text"]  # the headline counts batches, not the one fit call
    # At the end of the fit, one line about it; the summary itself is printed once, at finish().
    assert len(phrase("fit_line", call=1).findall(result["printed"])) == 1, result["printed"]
    assert says(result["printed"], "fit_result", batches=160, verdict="clean", found="nothing found")
    assert not says(result["printed"], "headline"), result["printed"]
    with_, without = result["with"], result["without"]
    assert with_["history"]["loss"] == without["history"]["loss"]
    assert with_["history"]["val_loss"] == without["history"]["val_loss"]
    assert all(np.array_equal(a, b) for a, b in zip(with_["weights"], without["weights"], strict=True))
    assert np.array_equal(with_["predictions"], without["predictions"])
    rows = result["csv"]
    assert len(rows) == 20
    assert all(float(row["leakdoctor/rss_bytes"]) > 0 and float(row["leakdoctor/step_seconds"]) > 0 for row in rows)
    assert all(float(row["leakdoctor/keras_models_alive"]) >= 1 for row in rows)
    expected = {"jax": "leakdoctor/jax_live_bytes_cpu", "torch": "leakdoctor/rss_bytes"}[backend]
    assert expected in rows[0] and rows[0]["val_loss"] not in ("", "NA")
    assert "leakdoctor/rss_bytes" in with_["history"]  # History records them too


# --- predict in a loop on inputs of changing shape --------------------------------------------------

def predict_changing_shapes(backend: str, calls: int) -> dict:
    keras = keras_on(backend)
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    doctor = LeakDoctorCallback(memory_limit=LIMIT, verbose=False)
    rng = np.random.default_rng(0)
    for rows in range(1, calls + 1):
        inputs = rng.normal(size=(rows, 32)).astype("float32")
        model.predict(inputs, batch_size=1024, verbose=0, callbacks=[doctor])  # predict-in-loop
    return doctor.finish().to_dict()


def test_predict_in_a_loop_on_changing_shapes_retraces_on_jax():
    summary = isolated(predict_changing_shapes, "jax", 40)
    found = finding(summary, "compile_cache")
    assert found["metric"] == "rss_bytes" and place(found) == site("predict-in-loop")
    assert says(found["evidence"], "keras_compiled", function="predict_step") and mentions(found["evidence"], "f32[")
    assert says(found["recommendation"], "fixed_shapes")
    assert summary["verdict"] == "leak" and len(summary["findings"]) == 1


def test_predict_in_a_loop_on_changing_shapes_is_clean_on_torch():
    summary = isolated(predict_changing_shapes, "torch", 40)
    assert summary["verdict"] == "clean" and kept(summary) == [], summary["findings"]
    assert summary["steps"] == 40


# --- within one fit: the batch clock --------------------------------------------------------------------

def activations_kept(batches: int) -> dict:
    """A subclassed model (torch backend, eager) that keeps every activation it computes."""
    keras = keras_on("torch")
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    class Keeper(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(64, activation="relu")
            self.out = keras.layers.Dense(1)
            self.activations = []

        def call(self, x):
            h = self.hidden(x)
            self.activations.append(h)  # activation-kept
            return self.out(h)

    x, y = regression_data(64 * batches, 32)
    model = Keeper()
    model.compile(optimizer="adam", loss="mse")
    doctor = LeakDoctorCallback(memory_limit=LIMIT, verbose=False)
    model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[doctor])
    return doctor.finish().to_dict()


def test_activations_kept_within_one_fit_are_found_on_the_batch_clock():
    batches = 160
    summary = isolated(activations_kept, batches)
    found = finding(summary, "retained_graph")
    # on memory, which the kept activations grow (and detach_retained would free), named at the model's
    # list and the line that appends to it; the list's length is explained by the same finding
    assert found["metric"] == "rss_bytes" and [f["cause"] for f in summary["findings"]] == ["retained_graph"]
    assert place(found) == f"activations_kept.<locals>.Keeper.activations ({site('activation-kept')})"
    assert says(found["evidence"], "within_fit", "fit_batches", call=1, batches=batches)
    assert says(found["evidence"], "list_grew", list="Keeper.activations") and mentions(found["evidence"], "(64, 64) float32"), \
        found["evidence"]
    assert 1 <= found["first_step"] <= found["detected_step"] <= batches  # on the clock of batches
    assert found["rate_per_step"] >= 64 * 64 * 4  # per batch: at least each batch's kept activation


def native_growth_in_fits(leaking_fits: tuple[int, ...], fits: int = 3, batches: int = 160) -> dict:
    """`fits` fits of one model (torch backend), a callback of the user's allocating 256 KiB of C memory
    (malloc, touched, never freed) after every batch of the fits numbered in `leaking_fits` (from 1)."""
    import ctypes

    keras = keras_on("torch")
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    kept: list[int] = []

    class Allocating(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.fit = 0

        def on_train_begin(self, logs=None):
            self.fit += 1

        def on_train_batch_end(self, batch, logs=None):
            if self.fit in leaking_fits:
                chunk = libc.malloc(256 * 1024)
                ctypes.memset(chunk, 1, 256 * 1024)
                kept.append(chunk)

    x, y = regression_data(64 * batches, 32)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    doctor, allocating = LeakDoctorCallback(memory_limit=LIMIT, verbose=False), Allocating()
    for _ in range(fits):
        model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[doctor, allocating])
    return doctor.finish().to_dict()


def test_native_growth_within_the_first_fit_only_is_withdrawn_once_later_fits_do_not_repeat_it():
    """A fit sees its own batches alone: growth that stops when the fit ends (a backend's caches filling
    in the first fit) looks like a leak there. The two fits after it, watched, grow nothing: the finding
    stays in the summary, withdrawn, and the run is clean. The same growth in every fit stays a leak."""
    once = isolated(native_growth_in_fits, (1,))
    [found] = [f for f in once["findings"] if f["cause"] == "native_memory"]
    assert (found["state"], found["severity"]) == ("withdrawn", None) and found["first_step"] <= 160, found  # fit 1
    assert found["reason"] and once["verdict"] == "clean", once["findings"]
    every = isolated(native_growth_in_fits, (1, 2, 3))
    assert every["verdict"] == "leak", every["findings"]
    assert finding(every, "native_memory")["state"] == "leak"


# --- a fit that raises, reuse, finish ----------------------------------------------------------------

class Stop(Exception):
    pass


def fit_that_raises(folder: str) -> dict:
    keras = keras_on("torch")
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    class Fail(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise Stop()

    x, y = regression_data(64, 8)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    doctor = LeakDoctorCallback(summary_path=Path(folder) / "leaks.json", verbose=False)
    try:
        model.fit(x, y, epochs=3, verbose=0, callbacks=[doctor, Fail()])  # fit-raises
    except Stop:
        pass
    model.fit(x, y, epochs=2, verbose=0, callbacks=[doctor])
    model.evaluate(x, y, verbose=0, callbacks=[doctor])
    first = doctor.finish()
    again = doctor.finish()
    model.fit(x, y, epochs=1, verbose=0, callbacks=[doctor])  # after finish: ignored
    return {"summary": first.to_dict(), "same": again is first, "after": doctor.summary.steps,
            "file": json.loads((Path(folder) / "leaks.json").read_text())}


def test_a_fit_that_raises_is_noted_and_the_callback_goes_on(tmp_path):
    result = isolated(fit_that_raises, str(tmp_path))
    summary = result["summary"]
    # the fit that raised never ended; the second fit and the evaluate did; the steps are the 8 training
    # batches of both fits (2 a epoch: 4 before the raise, 4 in the second fit)
    assert summary["steps"] == 8 and [c["kind"] for c in summary["calls"]] == ["fit", "evaluate"]
    assert says(summary["notes"], "call_did_not_return", call=1, kind="fit", site=site("fit-raises")), summary["notes"]
    assert result["same"] and result["after"] == 8
    assert result["file"]["steps"] == 8 and summary["errors"] == []


# --- what needs no fresh heap, in one jax process ------------------------------------------------------

def basics_on_jax() -> dict:
    return {"errors": bad_arguments(), "scope": clear_session_in_a_scope()}


@pytest.fixture(scope="module")
def basics() -> dict:
    return isolated(basics_on_jax)


# --- the remedy keeps what is not Keras's name counters -------------------------------------------

def clear_session_in_a_scope() -> dict:
    keras = keras_on("jax")
    from leakdoctor.remedies.clear_session import clear_session

    keras.config.set_dtype_policy("mixed_float16")
    with keras.name_scope("outer"):
        before = [keras.layers.Dense(2).name for _ in range(2)]
        clear_session()
        after = keras.layers.Dense(2).name
        policy = keras.config.dtype_policy().name
    keras.backend.clear_session()
    return {"before": before, "after": after, "policy": policy,
            "plain": keras.config.dtype_policy().name}


def test_clear_session_restarts_names_and_keeps_settings_and_open_scopes(basics):
    result = basics["scope"]
    assert result["before"] == ["dense", "dense_1"] and result["after"] == "dense"  # names restart
    assert result["policy"] == "mixed_float16"  # kept, where keras.backend.clear_session() drops it:
    assert result["plain"] == "float32"
    # and the name scope, open around the clear, closed without error


# --- construction --------------------------------------------------------------------------------

def bad_arguments() -> list[str]:
    keras_on("jax")
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    errors = []
    for kwargs in ({"remedies": "most"}, {"window": 0}, {"log_prefix": ""}, {"call_options": {"windows": 2}},
                   {"call_options": {"warmup": -1}}, {"call_options": 3}, {"summary_path": 42}):
        try:
            LeakDoctorCallback(**kwargs)
        except ValueError as err:
            errors.append(str(err))
    callback = LeakDoctorCallback(verbose=False)
    assert isinstance(callback, keras_on("jax").callbacks.Callback)
    import copy

    assert copy.deepcopy([callback])[0] is callback  # KerasTuner copies callbacks per trial: one history
    return errors


def test_bad_arguments_fail_at_construction_and_copies_share_one_history(basics):
    errors = basics["errors"]
    assert len(errors) == 7, errors
    for name, message in zip(("remedies", "window", "log_prefix", "windows", "warmup", "call_options",
                              "summary_path"), errors):
        assert name in message, (name, message)


# --- one clock: the findings' rates and the table agree ----------------------------------------------

def hoarding_fit(batches: int) -> dict:
    """One fit (torch backend) whose callback keeps a 256 kB array after every training batch."""
    keras = keras_on("torch")
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    class Hoarder(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.kept = []

        def on_train_batch_end(self, batch, logs=None):
            self.kept.append(np.ones(2**15))  # hoard

    x, y = regression_data(64 * batches, 32)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    doctor = LeakDoctorCallback(memory_limit=LIMIT, verbose=False)
    model.fit(x, y, epochs=1, batch_size=64, verbose=0, callbacks=[doctor, Hoarder()])
    return doctor.finish().to_dict()


def test_a_fit_counts_batches_and_its_rates_agree_with_the_table():
    batches = 240
    summary = isolated(hoarding_fit, batches)
    assert summary["steps"] == batches and summary["calls"] == [
        {"call": 1, "kind": "fit", "first_step": 1, "last_step": batches}]
    leaks = [f for f in summary["findings"] if counts(f) and f["unit"] == "bytes"]
    assert leaks, summary["findings"]
    found = leaks[0]
    assert 2**18 / 2 <= found["rate_per_step"] <= 2 * 2**18, found  # per batch: the 256 kB kept
    series = summary["series"][found["metric"]]
    points = [(step, value) for step, value in series["points"] if step >= found["first_step"]]
    shown = series["end"] - points[0][1]  # the growth the table's series shows since the growth began
    claimed = found["rate_per_step"] * (summary["steps"] - points[0][0])
    assert 0.5 * shown <= claimed <= 2 * shown, (claimed, shown)
    assert series["trend"] == "growing" and 0.5 * found["rate_per_step"] <= series["slope_per_step"] <= 2 * found["rate_per_step"]


def fits_with_one_callback(backend: str) -> dict[str, Any]:
    """Three models fitted with one callback: its summary's overhead (the calls' doctor and the fits')."""
    keras = keras_on(backend)
    from leakdoctor.callbacks.keras import LeakDoctorCallback

    x, y = regression_data(1024, 16)
    callback = LeakDoctorCallback(verbose=False, memory_limit=LIMIT)
    for _ in range(3):
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
        model.compile("adam", "mse")
        model.fit(x, y, batch_size=32, epochs=2, callbacks=[callback], verbose=0)
    return callback.summary.to_dict()["overhead"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_overhead_line_of_several_fits_is_the_sum_of_its_parts(backend):
    """Every doctor of the run (the calls' and each fit's) is in the printed total, and the parts add up to it:
    the fits' step() time was added to its part alone, a part larger than the total (issue #38)."""
    overhead = isolated(fits_with_one_callback, backend)
    parts = overhead["probe_seconds"] + overhead["thread_cpu_seconds"] + overhead["forensic_seconds"]
    assert overhead["total_seconds"] == pytest.approx(parts, rel=1e-9)
    assert overhead["fraction_of_run_time"] == pytest.approx(overhead["total_seconds"] / overhead["run_seconds"])
    assert overhead["probe_seconds"] <= overhead["total_seconds"]
