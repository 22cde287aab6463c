"""Ray Train: a `ray.train.torch.TorchTrainer` with two CPU workers (gloo) on a local Ray cluster that this
test starts, the torch `LeakDoctor` inside `train_loop_per_worker`, and only worker 1 leaking (2 MiB a step,
kept on the model) towards a real limit a few hundred MiB above its resident memory. With on_limit="stop"
both workers leave the loop at the same step, before the limit; rank 0's merged summary (the only file
written) says rank 1 asked and holds rank 1's finding; `leakdoctor.callbacks.ray.report` puts the doctor's
headline figures in Ray's `Result.metrics` and the merged summary in the run's checkpoint.

The cluster is shut down in a `finally`, and every process it started that is still alive then is killed;
the process group times out after COLLECTIVE_TIMEOUT seconds, the whole test after TIMEOUT."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray Train test needs ray[train] (pip install leakdoctor[ray])")
pytest.importorskip("ray.train.torch", reason="the Ray Train test needs ray[train] and torch")
pytest.importorskip("torch", reason="the Ray Train test needs torch")

import psutil  # noqa: E402 - after the skips
from test_distributed_stop import MIB, WINDOW, leaky_ddp_loop  # noqa: E402

from leakdoctor._lifecycle.stopping import FARTHEST  # noqa: E402

MAX_STEPS = 2000
TIMEOUT = 480  # seconds, for the whole test (pytest-timeout): starting Ray took most of 240 s at a load of 4-9 on 2 cores
COLLECTIVE_TIMEOUT = 60  # seconds a gloo collective may wait for the other worker before it fails
ROOT = Path(__file__).resolve().parent.parent


def train_loop_per_worker(config: dict) -> None:
    """One worker: the DDP loop of tests/test_distributed_stop.py on Ray's process group (prepare_model),
    worker 1 keeping 2 MiB a step on the model. Writes what it saw to rank{N}.json in the test's folder, then
    reports through leakdoctor."""
    import ray.train
    import ray.train.torch

    import leakdoctor
    from leakdoctor.callbacks import ray as leakdoctor_ray

    rank = ray.train.get_context().get_world_rank()
    step, doctor, limit = leaky_ddp_loop(rank, config["folder"], ray.train.torch.prepare_model, MAX_STEPS)
    Path(config["folder"], f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "last_step": step, "should_stop": doctor.should_stop, "limit": limit,
         "leakdoctor": leakdoctor.__file__}))
    leakdoctor_ray.report(doctor, {"worker_last_step": step})


def fit(folder: Path) -> "ray.train.Result":
    """The two-worker TorchTrainer run on the local cluster; its Result."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config={"folder": str(folder)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo", timeout_s=COLLECTIVE_TIMEOUT),
        run_config=RunConfig(name="leak", storage_path=str(folder / "ray")))
    return trainer.fit()


@pytest.fixture
def local_cluster(monkeypatch: pytest.MonkeyPatch):
    """A local Ray cluster of 2 CPUs whose workers import leakdoctor from this checkout, this module's
    functions by value and the tests' modules (test_distributed_stop's loop) by name; shut down afterwards,
    and whatever it started that is still alive then is killed."""
    path = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    for name, value in {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1",
                        "OPENBLAS_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}.items():
        monkeypatch.setenv(name, value)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * MIB)
    try:
        yield
    finally:
        started = psutil.Process().children(recursive=True)
        ray.shutdown()
        gone, alive = psutil.wait_procs(started, timeout=10)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=10)
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.mark.timeout(TIMEOUT)
def test_two_ray_train_workers_stop_together_when_one_leaks(local_cluster, tmp_path: Path):
    start = time.monotonic()
    result = fit(tmp_path)
    assert result.error is None, result.error
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(Path(s["leakdoctor"]).is_relative_to(ROOT) for s in seen), seen  # this checkout's leakdoctor
    steps = [s["last_step"] for s in seen]
    assert steps[0] == steps[1] < MAX_STEPS and all(s["should_stop"] for s in seen), seen
    stop = steps[0]

    # rank 0's merged summary, where summary_path says (an absolute path: a worker runs in Ray's folders),
    # and beside it rank 1's own (written when it found its leak, completed at the end)
    assert sorted(p.name for p in tmp_path.glob("leaks*.json")) == ["leaks.json", "leaks.rank1.json"]
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert [r["file"] for r in summary["ranks"]] == [str(tmp_path / "leaks.json"), str(tmp_path / "leaks.rank1.json")]
    assert summary["rank"] == 0 and summary["verdict"] == "leak" and summary["complete"]
    assert summary["stopped"]["step"] == stop == summary["steps"]
    by = summary["stopped_by"]
    assert by["rank"] == 1 and stop - FARTHEST * WINDOW < by["step"] <= stop
    assert by["reason"] == summary["stopped"]["reason"]
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["steps"] for r in ranks] == [stop, stop]
    assert ranks[1]["verdict"] == "leak" and ranks[1]["series"]["rss_bytes"]["peak"] < seen[1]["limit"]
    assert summary["projected_limit_step"] > stop
    # rank 1's finding, on the list that keeps the leak: gathered into rank 0's summary, not seen on rank 0.
    # Rank 0's own verdict is not checked: its resident memory includes Ray's runtime in the same process,
    # whose growth in this 2-second run it reports as native_memory (the plain gloo loop's rank 0 is clean).
    hoards = [f for f in ranks[1]["findings"] if f["cause"] == "container_growth" and "hoard" in f["metric"]]
    assert hoards and hoards[0] in summary["findings"], ranks[1]["findings"]
    assert hoards[0]["metric"] not in {f["metric"] for f in ranks[0]["findings"]}, ranks[0]["findings"]

    # the doctor's headline figures in Ray's result (rank 0's: the merged summary's), and yours beside them
    metrics = result.metrics
    assert metrics is not None, "report() attached no checkpoint: Ray Train kept no metrics"
    assert metrics["leakdoctor_verdict"] == "leak" and metrics["leakdoctor_leak"] == 1
    assert metrics["leakdoctor_findings"] == len(summary["findings"]) >= 1
    assert metrics["leakdoctor_step"] == metrics["leakdoctor_stopped_step"] == metrics["worker_last_step"] == stop
    assert metrics["leakdoctor_stopped_by_rank"] == 1
    assert metrics["leakdoctor_projected_limit_step"] == summary["projected_limit_step"]
    assert metrics["leakdoctor_rss_peak_bytes"] == ranks[1]["series"]["rss_bytes"]["peak"]
    assert 0 <= metrics["leakdoctor_overhead_fraction"] == summary["overhead"]["fraction_of_step_time"]
    # and the merged summary in the run's storage, as the checkpoint
    with result.checkpoint.as_directory() as folder:
        stored = json.loads(Path(folder, "leaks.json").read_text())
    assert stored["stopped_by"] == by and stored["ranks"] == ranks
    print(f"ray train run: stopped at step {stop} in {time.monotonic() - start:.1f} s")
