"""MLflow: metrics under `leakdoctor/`, a tag per finding (`leakdoctor.finding.N`) updated as it changes
state, and at the end the `leakdoctor.verdict` tag, the summary JSON and the plot as artifacts (under
`leakdoctor/`), in the run the script has active (`mlflow.active_run()`) or a new one.

    LeakDoctor(trackers=["mlflow"])                # the active run, else a new run of the current experiment
    LeakDoctor(trackers=[mlflow.active_run()])      # a run object (ActiveRun or Run)

A new run is made through MlflowClient, never made the active run: the script's own `mlflow.start_run()`
after the doctor still works, and the doctor's run is ended at finish(). Metrics are logged asynchronously
(MLflow's own queue), so a remote tracking server does not slow the doctor's samples; they are flushed at
the end.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from leakdoctor.trackers.base import PREFIX, Tracker, finding_record

if TYPE_CHECKING:
    from leakdoctor.reporting.summary import Summary

__all__ = ["MLflow"]

#: The tag of the final verdict.
VERDICT_TAG = "leakdoctor.verdict"
#: The prefix of the findings' tags: `leakdoctor.finding.1`, `.2`, ... in order of detection.
FINDING_TAG = "leakdoctor.finding."


def require() -> Any:
    try:
        import mlflow
    except ImportError as err:
        raise ImportError("trackers=['mlflow'] needs mlflow (or mlflow-skinny): pip install leakdoctor[mlflow]") from err
    return mlflow


def metric_key(name: str) -> str:
    """`leakdoctor/` + the series name in the characters MLflow takes (letters, digits, _ - . space : /)."""
    return PREFIX + re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name)


class MLflow(Tracker):
    """Logs to `run` (an ActiveRun or Run the script holds: never ended here), or to the run active at the
    first sample, or to a new run, ended at the end."""

    name = "mlflow"
    extra = "mlflow"

    def __init__(self, run: Any = None, run_name: str = "leakdoctor") -> None:
        self.run, self.run_name = run, run_name
        self.run_id: str | None = None
        self._own = False
        self._client: Any = None
        self._tags: dict[tuple[Any, ...], str] = {}  # finding identity -> its tag

    def open(self) -> None:
        mlflow = require()
        self._client = mlflow.MlflowClient()
        run = self.run if self.run is not None else mlflow.active_run()
        if run is None:
            run = self._client.create_run(_experiment_id(mlflow, self._client), run_name=self.run_name,
                                          tags={"leakdoctor": "true"})
            self._own = True
        self.run_id = run.info.run_id

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_key(name), value, now, step) for name, value in values.items()]
        self._client.log_batch(self.run_id, metrics=metrics, synchronous=False)

    def findings(self, step: int, changed: Sequence[Mapping[str, Any]]) -> None:
        for record in changed:
            identity = (record["cause"], record["metric"], record["where"])
            tag = self._tags.setdefault(identity, f"{FINDING_TAG}{len(self._tags) + 1}")
            self._client.set_tag(self.run_id, tag, _line(record, step))

    def verdict(self, summary: "Summary", plot: Path | None) -> None:
        self.findings(summary.steps, [finding_record(f) for f in summary.findings])
        self._client.set_tag(self.run_id, VERDICT_TAG, summary.verdict)
        self._client.log_dict(self.run_id, summary.to_dict(), PREFIX + "summary.json")
        if plot is not None:
            self._client.log_artifact(self.run_id, str(plot), PREFIX.rstrip("/"))

    def close(self) -> None:
        if self._client is None:
            return
        require().flush_async_logging()
        if self._own:
            self._client.set_terminated(self.run_id, "FINISHED")


def _experiment_id(mlflow: Any, client: Any) -> str:
    """The experiment a new run goes to: the one `mlflow.set_experiment` or MLFLOW_EXPERIMENT_ID/_NAME
    chose, else the default one."""
    try:
        from mlflow.tracking.fluent import _get_experiment_id  # what start_run() itself would use

        found = _get_experiment_id()
        if found:
            return str(found)
    except ImportError:
        pass
    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name:
        experiment = client.get_experiment_by_name(name)
        return experiment.experiment_id if experiment is not None else client.create_experiment(name)
    return "0"


def _line(record: Mapping[str, Any], step: int) -> str:
    """A finding's tag value: `leak: python_container at train.py:12 on rss_bytes (+4.1e+03 bytes/step) at step 80`."""
    severity = f" {record['severity']}" if record.get("severity") else ""
    place = f" at {record['where']}" if record.get("where") else ""
    remedy = f"; remedy {record['remedy']}" if record.get("remedy") else ""
    return (f"{record['state']}{severity}: {record['cause']}{place} on {record['metric']} "
            f"({record['rate_per_step']:+.3g} {record['unit']}/step) at step {step}{remedy}")
