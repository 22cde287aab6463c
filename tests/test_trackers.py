"""Experiment trackers (trackers=, `leakdoctor run --tracker`): a real torch loop that registers a forward hook
every step (a leak, `hook_accumulation`) and the same loop without it (clean), watched by the doctor with a
tracker; then the tracker's own files are read back with the tracker's own reader, and the series, the
findings and the verdict are found there. TensorBoard: its event files (EventAccumulator). MLflow: a file
store in tmp_path (MlflowClient). W&B: an offline run directory (wandb-summary.json and the run's .wandb log,
read with wandb's own DataStore). No network: W&B offline, its telemetry and error reporting off.

Also: the script's own writer or run is used (and left open), a new one is made and closed otherwise, a
tracker that fails is reported once and switched off while training goes on, and an unknown tracker name
fails at construction with the nearest valid one."""

from __future__ import annotations

import json
import os
import struct
import warnings
from pathlib import Path

import pytest
from procs import SCRIPTS, leakdoctor_run, run

# No network: MLflow reads these when it is imported (its telemetry client starts then), W&B at its setup.
NO_NETWORK = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "WANDB_MODE": "offline",
              "WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
              "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off", "WANDB__DISABLE_STATS": "true"}
for _name, _value in NO_NETWORK.items():
    os.environ.setdefault(_name, _value)

torch = pytest.importorskip("torch")

from leakdoctor import LeakDoctorWarning  # noqa: E402
from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor  # noqa: E402
from leakdoctor.trackers.base import Tracker  # noqa: E402

STEPS = 150


def train(leak: bool, steps: int = STEPS, log=None, **options: object):
    """A small torch regression loop; with `leak`, a forward hook registered every step and never removed;
    `log`, the script's own logging of each step's loss. The doctor's summary."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    doctor = TorchDoctor(model=model, optimizer=optimizer, overhead=1.0, memory_limit="4GiB", verbose=False,
                         **options)
    for _ in range(steps):
        if leak:
            model[1].register_forward_hook(lambda module, args, out: None)  # the leak: one more hook every step
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if log is not None:
            log(loss.item())
        doctor.step()
    return doctor.finish()


def hooks_finding(summary):
    (finding,) = [f for f in summary.findings if f.cause == "hook_accumulation"]
    return finding


# --- TensorBoard --------------------------------------------------------------------------------------

def events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def scalars(accumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def texts(accumulator, tag: str) -> list[tuple[int, str]]:
    """The text summaries under `tag` (TensorBoard's text plugin stores them as string tensors)."""
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in accumulator.Tensors(f"{tag}/text_summary")]


def test_tensorboard_the_scripts_writer_gets_the_series_findings_and_verdict(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    writer.add_scalar("loss", 1.0, 0)  # the script's own
    summary = train(leak=True, trackers=[writer])
    writer.add_scalar("loss", 0.5, STEPS)  # still open: the doctor flushed the script's writer, never closed it
    writer.close()
    assert summary.verdict == "leak" and not summary.errors, summary.text()
    finding = hooks_finding(summary)
    board = events(tmp_path / "tb")
    hooks = scalars(board, "leakdoctor/torch_hooks")
    assert len(hooks) > 20 and hooks[-1][1] > hooks[0][1] + 100  # the series, one point a sample, growing
    assert scalars(board, "loss")[-1] == (STEPS, 0.5)
    leaks = scalars(board, "leakdoctor/findings/leak")
    assert leaks[0][1] == 0 and leaks[-1][1] == 1
    first_leak = next(step for step, value in leaks if value == 1)
    changes = texts(board, "leakdoctor/findings")
    assert changes[0][0] == first_leak and "hook_accumulation" in changes[0][1] and "| leak |" in changes[0][1]
    assert texts(board, "leakdoctor/verdict") == [(STEPS, "leak")]
    final = texts(board, "leakdoctor/findings")[-1][1]
    assert finding.where.split("/")[-1] in final and f"| {finding.severity} |" in final
    assert "verdict LEAK" in texts(board, "leakdoctor/summary")[0][1]


def test_tensorboard_by_name_writes_a_new_run_under_runs_and_a_clean_verdict(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    summary = train(leak=False, trackers="tensorboard")
    assert summary.verdict == "clean" and not summary.errors, summary.text()
    (folder,) = (tmp_path / "runs").iterdir()  # SummaryWriter's default place, closed at the end
    board = events(folder)
    assert len(scalars(board, "leakdoctor/rss_bytes")) > 20
    assert {value for _, value in scalars(board, "leakdoctor/findings/leak")} == {0}
    assert "leakdoctor/findings/text_summary" in board.Tags()["tensors"]  # the final table: "no findings"
    assert texts(board, "leakdoctor/verdict") == [(STEPS, "clean")]


def test_tensorboardx_writer_is_taken_too(tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    writer = tensorboardX.SummaryWriter(logdir=str(tmp_path / "tbx"))
    summary = train(leak=True, steps=150, trackers=[writer])
    writer.close()
    assert summary.verdict == "leak"
    board = events(tmp_path / "tbx")
    assert scalars(board, "leakdoctor/findings/leak")[-1][1] == 1
    assert texts(board, "leakdoctor/verdict") == [(150, "leak")]


def test_leakdoctor_run_with_tracker_tensorboard(tmp_path):
    """`leakdoctor run --tracker tensorboard` on an unedited script: the run's events under ./runs."""
    summary_path = tmp_path / "leaks.json"
    result = run(leakdoctor_run("--tracker", "tensorboard", "-o", "overhead=1.0", "-o", "memory_limit=4GiB",
                                "--summary", summary_path, SCRIPTS / "torch_hooks.py", "150"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(summary_path.read_text())["verdict"] == "leak"
    (folder,) = (tmp_path / "runs").iterdir()
    board = events(folder)
    hooks = scalars(board, "leakdoctor/torch_hooks")
    assert hooks[-1][1] > hooks[0][1] + 50
    assert scalars(board, "leakdoctor/findings/leak")[-1][1] == 1
    assert any("hook_accumulation" in text for _, text in texts(board, "leakdoctor/findings"))
    assert texts(board, "leakdoctor/verdict")[-1][1] == "leak"


def test_leakdoctor_run_refuses_an_unknown_tracker_before_the_script_runs(tmp_path):
    script = tmp_path / "never.py"
    script.write_text("open('ran', 'w').close()\n")
    result = run(leakdoctor_run("--tracker", "mlflow", "--tracker", "tensorbord", script), cwd=tmp_path)
    assert result.returncode == 2 and "did you mean 'tensorboard'?" in result.stderr, result.stderr
    assert not (tmp_path / "ran").exists()


def test_tracker_takes_the_next_word_as_its_name_and_repeats():
    from leakdoctor._runner.command import split

    assert split(["run", "--tracker", "mlflow", "--tracker", "wandb", "train.py", "--tracker", "x"]) == \
        (["run", "--tracker", "mlflow", "--tracker", "wandb", "train.py"], ["--tracker", "x"])


# --- MLflow -------------------------------------------------------------------------------------------

@pytest.fixture
def mlflow(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this flag
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def by_step(metric) -> tuple[int, int]:
    return metric.step, metric.timestamp


def artifact(client, run_id: str, path: str, into: Path) -> Path:
    return Path(client.download_artifacts(run_id, path, str(into)))


def test_mlflow_the_active_run_gets_metrics_finding_tags_verdict_summary_and_plot(mlflow, tmp_path):
    with mlflow.start_run() as active:
        mlflow.log_param("lr", 0.01)  # the script's own
        summary = train(leak=True, trackers="mlflow", plot_path=tmp_path / "leaks.png")
        assert mlflow.active_run().info.run_id == active.info.run_id  # still the script's, still open
    assert summary.verdict == "leak" and not summary.errors, summary.text()
    finding = hooks_finding(summary)
    client = mlflow.MlflowClient()
    (stored,) = client.search_runs([active.info.experiment_id])  # no run of its own
    assert stored.info.run_id == active.info.run_id and stored.data.params == {"lr": "0.01"}
    hooks = sorted(client.get_metric_history(active.info.run_id, "leakdoctor/torch_hooks"), key=by_step)
    assert len(hooks) > 20 and hooks[-1].value > hooks[0].value + 100
    leaks = sorted(client.get_metric_history(active.info.run_id, "leakdoctor/findings/leak"), key=by_step)
    assert [m.step for m in leaks] == [m.step for m in hooks] and (leaks[0].value, leaks[-1].value) == (0, 1)
    tags = stored.data.tags
    assert tags["leakdoctor.verdict"] == "leak"
    assert tags["leakdoctor.finding.1"].startswith(f"leak {finding.severity}: hook_accumulation at {finding.where}")
    written = json.loads(artifact(client, active.info.run_id, "leakdoctor/summary.json", tmp_path).read_text())
    assert written["verdict"] == "leak"
    assert [(f["cause"], f["state"]) for f in written["findings"]] == [("hook_accumulation", "leak")]
    plot = artifact(client, active.info.run_id, "leakdoctor/leaks.png", tmp_path)
    assert plot.read_bytes() == (tmp_path / "leaks.png").read_bytes()


def test_mlflow_without_an_active_run_starts_one_and_ends_it(mlflow, tmp_path):
    summary = train(leak=False, trackers=["mlflow"])
    assert summary.verdict == "clean" and not summary.errors, summary.text()
    assert mlflow.active_run() is None  # made through the client: never the script's active run
    client = mlflow.MlflowClient()
    (stored,) = client.search_runs(["0"])
    assert stored.info.status == "FINISHED" and stored.data.tags["leakdoctor.verdict"] == "clean"
    assert not any(tag.startswith("leakdoctor.finding.") for tag in stored.data.tags)
    assert len(client.get_metric_history(stored.info.run_id, "leakdoctor/rss_bytes")) > 20
    assert {m.value for m in client.get_metric_history(stored.info.run_id, "leakdoctor/findings/leak")} == {0}
    written = json.loads(artifact(client, stored.info.run_id, "leakdoctor/summary.json", tmp_path).read_text())
    assert written["verdict"] == "clean" and written["steps"] == STEPS


def test_mlflow_that_cannot_write_its_store_is_reported_once_and_the_run_goes_on(mlflow, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the store's folder should be\n")
    mlflow.set_tracking_uri(blocked.as_uri())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(leak=True, trackers="mlflow")
    said = [str(w.message) for w in caught if issubclass(w.category, LeakDoctorWarning)]
    assert len([m for m in said if "tracker mlflow failed" in m]) == 1, said
    assert summary.steps == STEPS and summary.verdict == "leak"
    assert [e["part"] for e in summary.errors] == ["tracker mlflow"]


# --- Weights & Biases ---------------------------------------------------------------------------------

@pytest.fixture
def wandb(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for name, value in {**NO_NETWORK, "WANDB_DIR": str(tmp_path), "WANDB_PROJECT": "leakdoctor-test",
                        "WANDB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_CONFIG_DIR": str(tmp_path / "config"),
                        "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(name, value)
    wandb.teardown()  # wandb reads the environment once a process: a fresh setup for this test's folder
    yield wandb
    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()


def offline_run(tmp_path: Path) -> Path:
    """The run's folder, once wandb's service has written all of it (it writes the log on its own; a run's
    finish() may return first)."""
    __import__("wandb").teardown()
    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    return folder


def logged(folder: Path) -> tuple[list[dict], dict]:
    """(the history rows, the final run summary) of an offline run, read from its .wandb log: wandb's own
    Record protobufs, in wandb's LevelDB-style log (a 7-byte file header, 32 KiB blocks of records each with
    a 7-byte header: CRC, length, type FULL/FIRST/MIDDLE/LAST). wandb 0.31 writes no wandb-summary.json
    offline, and its Python reader of the log (sdk.internal.datastore) is gone, so the framing is read here."""
    from wandb.proto import wandb_internal_pb2

    (log,) = folder.glob("*.wandb")
    rows, summary = [], {}
    for data in _log_records(log.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append(_items(record.history.item))
        elif kind == "summary":
            summary.update(_items(record.summary.update))
    return rows, summary


def _items(items) -> dict:
    """{key: value} of a record's items; a nested key (a media value's fields) makes nested dicts."""
    found: dict = {}
    for item in items:
        *path, last = list(item.nested_key) or [item.key]
        place = found
        for part in path:
            place = place.setdefault(part, {})
        place[last] = json.loads(item.value_json)
    return found


def _log_records(raw: bytes, block: int = 32768):
    assert raw[:4] == b":W&B", raw[:7]
    position, chunks = 7, []
    while position + 7 <= len(raw):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[position:position + 7])
        chunks.append(raw[position + 7:position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # FULL, LAST
            yield b"".join(chunks)
            chunks = []


def test_wandb_the_scripts_run_gets_metrics_findings_table_verdict_and_plot(wandb, tmp_path):
    script_run = wandb.init(project="leakdoctor-test")
    summary = train(leak=True, trackers=[script_run], plot_path=tmp_path / "leaks.png",
                    log=lambda loss: script_run.log({"loss": loss}))  # the script logs its loss every step
    script_run.log({"loss": 0.5})  # still open: the doctor's values joined the script's steps
    script_run.finish()
    assert summary.verdict == "leak" and not summary.errors, summary.text()
    finding = hooks_finding(summary)
    folder = offline_run(tmp_path)
    rows, stored = logged(folder)
    assert stored["leakdoctor/verdict"] == "leak" and stored["leakdoctor/steps"] == STEPS
    (record,) = stored["leakdoctor/findings_list"]
    assert (record["cause"], record["state"], record["severity"], record["where"]) == \
        ("hook_accumulation", "leak", finding.severity, finding.where)
    assert stored["leakdoctor/findings_table"]["_type"] == "table-file"
    assert stored["leakdoctor/plot"]["_type"] == "image-file"
    written = json.loads((folder / "files" / "leakdoctor-summary.json").read_text())
    assert written["verdict"] == "leak"
    hooks = [row["leakdoctor/torch_hooks"] for row in rows if "leakdoctor/torch_hooks" in row]
    assert len(hooks) > 20 and hooks[-1] > hooks[0] + 100
    assert [row["_step"] for row in rows] == list(range(STEPS + 1))  # the script's steps, one row each
    (change,) = [row for row in rows if "leakdoctor/findings_changed" in row]  # a table when the finding appeared
    table = json.loads((folder / "files" / change["leakdoctor/findings_changed"]["path"]).read_text())
    assert [row[:2] for row in table["data"]] == [["hook_accumulation", "leak"]]
    assert change["leakdoctor/findings/leak"] == 1 and change["leakdoctor/step"] == finding.detected_step


def test_wandb_by_name_without_a_run_makes_one_and_finishes_it(wandb, tmp_path):
    summary = train(leak=False, trackers="wandb")
    assert summary.verdict == "clean" and not summary.errors, summary.text()
    assert wandb.run is None  # never the script's wandb.run
    folder = offline_run(tmp_path)
    rows, stored = logged(folder)
    assert stored["leakdoctor/verdict"] == "clean" and stored["leakdoctor/findings_list"] == []
    assert len([row for row in rows if "leakdoctor/rss_bytes" in row]) > 20
    assert {row["leakdoctor/findings/leak"] for row in rows if "leakdoctor/findings/leak" in row} == {0}


# --- failures and mistakes ----------------------------------------------------------------------------

class Failing(Tracker):
    """A tracker whose disk fills up at the 5th sample."""

    name = "failing"

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def scalars(self, step, values):
        self.calls += 1
        if self.calls == 5:
            raise OSError(28, "No space left on device")

    def close(self):
        self.closed = True


def test_a_failing_tracker_is_reported_once_switched_off_and_training_goes_on(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    failing, writer = Failing(), SummaryWriter(log_dir=str(tmp_path / "tb"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(leak=True, trackers=[failing, writer])
    writer.close()
    said = [str(w.message) for w in caught if issubclass(w.category, LeakDoctorWarning)]
    assert len([m for m in said if "tracker failing" in m]) == 1 and "No space left on device" in said[0], said
    assert failing.calls == 5 and failing.closed  # never called again; still closed at the end
    assert summary.steps == STEPS and summary.verdict == "leak"  # the run and the doctor went on
    assert [e["part"] for e in summary.errors] == ["tracker failing"]
    assert texts(events(tmp_path / "tb"), "leakdoctor/verdict") == [(STEPS, "leak")]  # the other tracker too


def test_a_tracker_whose_library_is_missing_says_what_to_install_and_the_run_goes_on(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.warns(LeakDoctorWarning, match=r"tracker wandb failed \(ImportError: .*pip install leakdoctor\[wandb\]"):
        summary = train(leak=False, steps=60, trackers=["wandb"])
    assert summary.steps == 60 and [e["part"] for e in summary.errors] == ["tracker wandb"]


@pytest.mark.parametrize("given, said", [("tensorbord", "did you mean 'tensorboard'?"),
                                         (["mlflow", "wandbb"], "did you mean 'wandb'?"),
                                         ([object()], "expected a tracker name")])
def test_an_unknown_tracker_fails_at_construction(given, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace("?", r"\?")):
        TorchDoctor(trackers=given, verbose=False)


def test_names_are_kept_once_and_none_is_no_tracker():
    from leakdoctor.settings import Settings

    assert Settings.create(trackers=["TensorBoard", "tensorboard", "mlflow"]).trackers == ("tensorboard", "mlflow")
    assert Settings.create(trackers=None).trackers == () == Settings.create().trackers


def test_the_trackers_import_no_tracker_library_and_a_doctor_that_never_stepped_opens_none(tmp_path):
    code = ("import sys\nimport leakdoctor, leakdoctor.doctor\n"
            "from leakdoctor.trackers import feed, tensorboard, mlflow, wandb, TensorBoard, MLflow, WandB\n"
            "from leakdoctor import LeakDoctor\n"
            "LeakDoctor(trackers=['tensorboard', 'mlflow', 'wandb'], verbose=False).finish()\n"
            "print(sorted(m for m in ('torch', 'tensorboard', 'tensorboardX', 'mlflow', 'wandb') if m in sys.modules))")
    result = run([__import__("sys").executable, "-c", code], cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_a_name_opens_a_tracker_on_rank_0_only_and_a_given_writer_on_any_rank(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    from leakdoctor import LeakDoctor

    monkeypatch.chdir(tmp_path)
    writer = SummaryWriter(log_dir=str(tmp_path / "mine"))
    with LeakDoctor(trackers=["tensorboard", writer], rank=1, overhead=1.0, verbose=False) as doctor:
        for _ in range(30):
            doctor.step()
    writer.close()
    assert not (tmp_path / "runs").exists()  # rank 1 made no writer of its own
    assert len(scalars(events(tmp_path / "mine"), "leakdoctor/rss_bytes")) > 5
