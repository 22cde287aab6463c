"""Ray Train: the torch doctor inside `train_loop_per_worker`, and its headline figures in Ray's results.

    import ray.train
    from ray.train.torch import TorchTrainer
    from leakdoctor.callbacks import ray as leakdoctor_ray
    from leakdoctor.callbacks.torch import LeakDoctor

    def train_loop_per_worker(config):
        model = ray.train.torch.prepare_model(build_model())        # DDP, on Ray's process group
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with LeakDoctor(model=model, optimizer=opt, on_limit="stop",
                        summary_path="/abs/path/leaks.json") as doctor:  # absolute: see below
            for x, y in loader:
                ...forward, backward, opt.step()...
                doctor.step()
                if doctor.should_stop:                              # True on every worker at the same step
                    break
        leakdoctor_ray.report(doctor)                               # on every worker, after the loop

    result = TorchTrainer(train_loop_per_worker,
                          scaling_config=ray.train.ScalingConfig(num_workers=2)).fit()
    result.metrics["leakdoctor_verdict"]                            # 'clean', 'leak', ...

Ray Train's TorchTrainer sets up torch.distributed in every worker (gloo on CPU, NCCL on GPUs) before
`train_loop_per_worker` runs, so the torch `LeakDoctor` works there as in any DDP loop: each worker
measures itself, finish() gathers every worker's findings into rank 0's summary, and on_limit="stop" stops
every worker at the same step. What differs under Ray:

- A worker's current folder is one of Ray's (/tmp/ray/session_*/artifacts/...): give `summary_path` an
  absolute path (on a cluster, shared storage), or rely on `report`, which puts the summary in the run's
  storage (`RunConfig(storage_path=...)`) where the driver can read it.
- `train_loop_per_worker` runs in a thread of the worker, so the doctor installs no SIGTERM handler (Ray
  owns the worker's signals); `heartbeat=` and `oom_watermark=` still leave a summary of a killed worker.
- Ray sets LOCAL_RANK: with `prometheus_port=` each worker serves base port + LOCAL_RANK, as under torchrun.
- A worker's resident memory includes Ray's own runtime in that process: in a run of a few seconds its
  growth can show as a `native_memory` finding on a worker that does not leak.

`report` is the only addition. It sends the doctor's headline figures through `ray.train.report` (names as
the Prometheus exporter's: `leakdoctor_verdict`, `leakdoctor_findings`, ...; see `figures`). Ray keeps rank
0's, whose summary is the merged one. Ray Train (its default engine since 2.x, "Train V2") keeps metrics in
`Result.metrics` only from a report that carries a checkpoint, so by default rank 0 attaches one: a folder
holding the merged summary as `leaks.json`, which also lands the summary in the run's storage
(`Checkpoint.from_directory(...)`, `result.checkpoint.as_directory()` to read it). Pass your own
`checkpoint=` to attach yours instead, or `checkpoint=None` for none (then the metrics reach Ray's
callbacks and loggers, not `Result.metrics`). Like every `ray.train.report`, call it on every worker the
same number of times: Ray waits for all of them.

Ray is imported when `report` is called, not with this module; without it an ImportError says what to
install (`pip install leakdoctor[ray]`).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping

from leakdoctor.reporting.summary import Summary

__all__ = ["report", "figures", "SUMMARY_FILE", "SUMMARY"]

#: The name of the summary in the checkpoint `report` attaches by default.
SUMMARY_FILE = "leaks.json"
#: `checkpoint=` default of `report`: attach the merged summary as rank 0's checkpoint.
SUMMARY = "summary"


def require_ray() -> Any:
    """The `ray.train` module, or an ImportError that says what to install."""
    try:
        import ray.train
    except ImportError as err:
        raise ImportError("leakdoctor's Ray Train support needs ray[train]: pip install leakdoctor[ray]") from err
    return ray.train


def figures(summary: Summary) -> dict[str, Any]:
    """The headline figures of a summary, flat, for a metrics logger. Named as the Prometheus exporter's
    metrics: the verdict (as a string and as a 0/1 `leak` flag, which plots), the findings and major leaks,
    the steps, resident memory at the end (this rank's) and its peak (the highest of any rank, the one that
    meets the limit first), the doctor's overhead as a fraction of step time, and, when they exist, the step
    the memory limit is projected at, the step the run stopped at and the rank that asked it to stop."""
    out: dict[str, Any] = {
        "leakdoctor_verdict": summary.verdict,
        "leakdoctor_leak": int(summary.verdict == "leak"),
        "leakdoctor_findings": len(summary.findings),
        "leakdoctor_leaks": len(summary.leaks),
        "leakdoctor_step": summary.steps,
        "leakdoctor_overhead_fraction": float(summary.overhead.get("fraction_of_step_time", 0.0)),
    }
    rss = summary.series.get("rss_bytes")
    if rss is not None:
        peaks = [r["series"]["rss_bytes"]["peak"] for r in summary.ranks if "rss_bytes" in r.get("series", {})]
        out.update(leakdoctor_rss_bytes=rss.end, leakdoctor_rss_peak_bytes=max([rss.peak, *peaks]))
    if summary.projected_limit_step is not None:
        out["leakdoctor_projected_limit_step"] = summary.projected_limit_step
    if summary.stopped:
        out["leakdoctor_stopped_step"] = summary.stopped["step"]
    if summary.stopped_by and summary.stopped_by.get("rank") is not None:
        out["leakdoctor_stopped_by_rank"] = summary.stopped_by["rank"]
    return out


def report(doctor: Any, metrics: Mapping[str, Any] | None = None, *, checkpoint: Any = SUMMARY) -> dict[str, Any]:
    """Finish `doctor` if it is still running (a collective under torch.distributed: every worker calls
    this) and `ray.train.report` its `figures` with your `metrics` (yours win a name both use). Rank 0's
    are the merged summary's; they are what Ray keeps. `checkpoint`: "summary" (the default) attaches, on
    rank 0, a checkpoint holding the merged summary as `leaks.json`, which Ray Train needs to keep the
    metrics in `Result.metrics`; a `ray.train.Checkpoint` attaches yours; None attaches none. Returns the
    metrics reported."""
    if isinstance(checkpoint, str) and checkpoint != SUMMARY:
        raise ValueError(f"checkpoint={checkpoint!r}: expected {SUMMARY!r}, a ray.train.Checkpoint or None")
    train = require_ray()
    summary = doctor.finish()
    reported = {**figures(summary), **(metrics or {})}
    if not isinstance(checkpoint, str):  # yours, or None
        train.report(reported, checkpoint=checkpoint)
    elif train.get_context().get_world_rank() != 0:
        train.report(reported, checkpoint=None)
    else:
        with tempfile.TemporaryDirectory(prefix="leakdoctor-") as folder:
            summary.write(os.path.join(folder, SUMMARY_FILE))
            train.report(reported, checkpoint=train.Checkpoint.from_directory(folder))
    return reported

