"""The options contract (issue #25): the options are defined once (leakdoctor.settings.OPTIONS) and the
docs' options table (docs/options.md), Settings, the typed keyword arguments and every entry point follow that definition; every
entry point refuses a misspelt name the same way, with a suggestion; every doctor and callback has
`finish()` and `summary`; the Keras callback prints one summary per run. Real frameworks, no mocks
(Keras in a fresh process: its backend is chosen at its import)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import io
import re
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
from helpers import isolated, phrase, says

from leakdoctor.settings import (NAMES, OPTIONS, DoctorOptions, Settings, UnknownOptionError, options_table)

OPTIONS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "options.md"
#: The public doctors and callbacks: (module, class name).
ENTRY_POINTS = [("leakdoctor.doctor", "LeakDoctor"), ("leakdoctor.callbacks.torch", "LeakDoctor"),
                ("leakdoctor.callbacks.flax", "LeakDoctor"), ("leakdoctor.callbacks.mlx", "LeakDoctor"),
                ("leakdoctor.callbacks.lightning", "LeakDoctorCallback")]


def entry_point(module: str, name: str) -> type:
    if module.endswith(".mlx"):
        pytest.importorskip("mlx.core")
    return getattr(__import__(module, fromlist=[name]), name)


# --- one definition ---------------------------------------------------------------------------------

def docs_options_table() -> str:
    lines = OPTIONS_PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_the_docs_options_table_is_the_one_generated_from_the_definition():
    assert docs_options_table() == options_table()


def test_every_option_has_its_row_in_the_docs_table():
    rows = docs_options_table().splitlines()[2:]
    assert [re.match(r"\| `(\w+)` \|", row).group(1) for row in rows] == [o.name for o in OPTIONS]
    assert all(o.meaning and o.valid for o in OPTIONS)


def test_settings_and_the_typed_keyword_arguments_follow_the_definition():
    names = [o.name for o in OPTIONS]
    assert [f.name for f in dataclasses.fields(Settings)] == names
    assert list(DoctorOptions.__annotations__) == names
    assert set(names) == NAMES and len(names) == len(NAMES)
    defaults = Settings.create()
    for option in OPTIONS:  # every default passes its own check
        option.check(option.name, option.default)
    assert defaults.remedies == () and defaults.prometheus_host == "127.0.0.1"


def test_the_documented_investigate_steps_default_is_the_effective_one():
    option = next(o for o in OPTIONS if o.name == "investigate_steps")
    assert option.default is None and "max(8, window)" in option.meaning
    assert Settings.create().investigate_steps == 8
    assert Settings.create(window=12).investigate_steps == 12
    assert Settings.create(window=12, investigate_steps=3).investigate_steps == 3


@pytest.mark.parametrize(("module", "name"), ENTRY_POINTS)
def test_each_constructor_takes_the_options_and_documents_every_argument(module, name):
    cls = entry_point(module, name)
    parameters = inspect.signature(cls.__init__).parameters
    variadic = [p for p in parameters.values() if p.kind is p.VAR_KEYWORD]
    assert [(p.name, p.annotation) for p in variadic] == [("options", "Unpack[DoctorOptions]")]
    own = [p for p in parameters if p not in ("self", "options")]
    assert not NAMES & set(own)  # an option is never redefined (and drifts) in one constructor
    doc = inspect.getdoc(cls)
    for section in ("Args:", "Raises:", "Example:"):
        assert section in doc, (name, section)
    for argument in own + ["**options"] + [o.name for o in OPTIONS]:
        assert re.search(rf"^\s*{re.escape(argument)}:", doc, re.M), (module, argument)


# --- a misspelt option, at every entry point ------------------------------------------------------------

@pytest.mark.parametrize(("module", "name"), ENTRY_POINTS)
def test_each_doctor_and_callback_refuses_a_misspelt_option_with_a_suggestion(module, name):
    cls = entry_point(module, name)
    with pytest.raises(UnknownOptionError, match=r"'remedys': did you mean 'remedies'\?") as caught:
        cls(remedys="safe", verbose=False)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)
    assert name in str(caught.value) and "summary_path" in str(caught.value)  # where, and the valid names
    with pytest.raises(ValueError, match=r"window=0: expected an int >= 1"):  # a bad value stays a ValueError
        cls(window=0)


def test_a_misspelt_own_argument_is_suggested_too():
    from leakdoctor.callbacks.torch import LeakDoctor

    with pytest.raises(TypeError, match=r"'watch_modle': did you mean 'watch_model'\?"):
        LeakDoctor(watch_modle=False)


def test_leakdoctor_run_refuses_a_misspelt_option_before_the_script_runs(tmp_path, capsys):
    from leakdoctor.cli import main

    script = tmp_path / "never.py"
    script.write_text("open('ran', 'w').close()\n")
    assert main(["run", "-o", "remedys=safe", str(script)]) == 2
    assert "unknown option 'remedys': did you mean 'remedies'?" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_the_pytest_plugin_refuses_a_misspelt_option():
    from leakdoctor.pytest_plugin import check_for_leaks

    with pytest.raises(UnknownOptionError, match=r"'remedys': did you mean 'remedies'\?"):
        check_for_leaks(lambda: None, steps=10, remedys="safe")
    with pytest.raises(UnknownOptionError, match=r"'stpes': did you mean 'steps'\?"):
        check_for_leaks(lambda: None, stpes=10)


def test_lightnings_old_watch_module_warns_and_means_watch_model():
    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    with pytest.warns(DeprecationWarning, match="watch_model"):
        callback = LeakDoctorCallback(watch_module=False)
    assert callback.watch_model is False


# --- finish() and summary, everywhere -------------------------------------------------------------------

@pytest.mark.parametrize(("module", "name"), ENTRY_POINTS[:4])
def test_each_loop_doctor_has_finish_and_summary(module, name):
    doctor = entry_point(module, name)(verbose=False, warmup=0)
    for _ in range(5):
        doctor.step()
    assert doctor.summary.steps == 5 and not doctor.finished
    final = doctor.finish()
    assert doctor.finished and doctor.finish() is final and doctor.summary is final


def test_the_lightning_callback_has_finish_and_summary_before_and_after_fit():
    import lightning.pytorch as L
    import torch
    from torch import nn

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = LeakDoctorCallback(verbose=False)
    before = callback.summary
    assert before.steps == 0 and before.verdict == "unwatched" and "fit() has not started" in before.unwatched["reason"]
    assert callback.finish().verdict == "unwatched"  # nothing to end yet
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 4)), batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(max_steps=10, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, callbacks=[callback])
        trainer.fit(Tiny(), data)
    final = callback.finish()
    assert final.steps == 10 and callback.summary is final and callback.finish() is final


# --- the Keras callback -----------------------------------------------------------------------------------

def keras_two_fits() -> dict[str, Any]:
    """One callback, two fits (one verbose, one not), then finish(): what was printed, and the API."""
    import os

    os.environ["KERAS_BACKEND"] = "jax"
    warnings.filterwarnings("ignore")
    import keras
    import numpy as np

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    printed = io.StringIO()
    result: dict[str, Any] = {}
    with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(io.StringIO()):
        callback = LeakDoctorCallback(warmup=2, window=2)
        result["before"] = (callback.summary.steps, callback.summary.verdict)
        for verbose in (1, 0):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(x, x[:, :1], epochs=2, batch_size=16, verbose=verbose, callbacks=[callback])
        result["snapshot_steps"] = callback.summary.steps
        final = callback.finish()
        result["same"] = callback.finish() is final and callback.summary is final
        result["steps"] = final.steps
    result["printed"] = printed.getvalue()
    for bad in ({"remedys": "safe"}, {"call_options": {"windw": 2}}):
        try:
            LeakDoctorCallback(**bad)
        except TypeError as err:
            result.setdefault("errors", []).append(str(err))
    dropped = weakref.ref(LeakDoctorCallback(verbose=False))
    gc.collect()
    result["dropped_collected"] = dropped() is None  # nothing (atexit, SIGTERM) keeps it alive
    return result


def test_the_keras_callback_prints_one_summary_for_a_run_of_two_fits():
    result = isolated(keras_two_fits)
    printed = result["printed"]
    assert len(phrase("headline", framework="keras").findall(printed)) == 1, printed
    assert len(phrase("fit_line", call=1).findall(printed)) == 1
    assert not says(printed, "fit_call", call=2)  # fit 2: verbose=0
    # steps are the training batches (issue #38, one clock): 2 fits x 2 epochs x 4 batches
    assert result["before"] == (0, "unwatched") and result["snapshot_steps"] == 16 and result["steps"] == 16
    assert result["same"]
    assert "'remedys': did you mean 'remedies'?" in result["errors"][0]
    assert "'windw': did you mean 'window'?" in result["errors"][1]
    assert result["dropped_collected"]


def test_the_keras_callback_uses_the_doctors_public_api_only():
    source = (Path(__file__).resolve().parent.parent / "leakdoctor" / "callbacks" / "keras.py").read_text()
    for private in ("._publisher", "._clinic", "atexit", "_result"):
        assert private not in source, private


def test_leakdoctor_run_hands_on_limit_to_the_doctor():
    from leakdoctor._runner.session import Session

    assert Session({"remedies": "off"}, "stop").doctor_options() == {"remedies": "off", "on_limit": "stop"}
    assert Session({"remedies": "off"}, None).doctor_options() == {"remedies": "off"}


# --- one option list: everything else derived (issue #39) -------------------------------------------------

def test_the_checked_in_option_types_are_the_ones_derived_from_the_definition():
    """Type checkers read no class built at run time, so DoctorOptions and Settings' fields are generated
    source (leakdoctor/_option_types.py); this keeps them what OPTIONS says."""
    from leakdoctor.settings import TYPES_MODULE, types_source

    assert TYPES_MODULE.read_text() == types_source(), "regenerate: python -m leakdoctor.settings"
    typed = {name: getattr(kind, "__forward_arg__", kind) for name, kind in DoctorOptions.__annotations__.items()}
    assert typed == {o.name: o.accepts for o in OPTIONS}
    held = {f.name: f.type for f in dataclasses.fields(Settings)}
    assert held == {o.name: o.held for o in OPTIONS}


def test_the_pytest_plugins_defaults_are_valid_options_and_its_own_arguments_its_signatures():
    from leakdoctor.pytest_plugin import DOCTOR_DEFAULTS, OWN

    assert set(DOCTOR_DEFAULTS) <= NAMES
    settings = Settings.create(**DOCTOR_DEFAULTS)
    assert all(getattr(settings, name) == value for name, value in DOCTOR_DEFAULTS.items())
    assert OWN == ("steps", "max_bytes_per_step", "fail_on") and not NAMES & set(OWN)


def test_the_severities_are_written_in_one_place():
    """No module restates the severities as a tuple or a set of literals: they are schema.SEVERITIES."""
    import ast

    from leakdoctor._base.schema import SEVERITIES

    package = Path(__file__).resolve().parent.parent / "leakdoctor"
    restated = []
    for path in package.rglob("*.py"):
        if re.search(r"^SEVERITIES = ", path.read_text(), re.M):
            continue  # the one place (_base/schema.py)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and \
                    {e.value for e in node.elts if isinstance(e, ast.Constant)} >= set(SEVERITIES):
                restated.append(f"{path.relative_to(package)}:{node.lineno}")
    assert restated == [], restated


@pytest.mark.parametrize(("options", "hint"), [({"sampler": "thraed"}, "did you mean 'thread'?"),
                                               ({"on_limit": "stpo"}, "did you mean 'stop'?"),
                                               ({"remedies": "safee"}, "did you mean 'safe'?"),
                                               ({"remedies": ["gc_colect"]}, "did you mean 'gc_collect'?")])
def test_a_misspelt_value_of_fixed_choices_is_answered_with_the_nearest(options, hint):
    with pytest.raises(ValueError, match=re.escape(hint)):
        Settings.create(**options)
