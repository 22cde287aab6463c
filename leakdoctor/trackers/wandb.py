"""Weights & Biases: metrics under `leakdoctor/` (against `leakdoctor/step`), a findings table logged each
time a finding appears or changes state, and at the end the verdict and findings in the run's summary
(`leakdoctor/verdict`, `leakdoctor/findings_list`), the final findings table (`leakdoctor/findings_table`), the summary JSON as a run file and
the plot as an image, in the script's run (`wandb.run`) or a new one.

    LeakDoctor(trackers=["wandb"])                 # wandb.run if the script has one, else a new run
    LeakDoctor(trackers=[run])                      # a run from wandb.init()

In the script's run, the doctor's values join the script's next `wandb.log` (commit=False), so the script's
own steps are left as they are. A new run (project WANDB_PROJECT, else "leakdoctor") is made with
reinit="create_new", so it is never `wandb.run` and the script's own `wandb.init()` is unaffected; it is
finished at the end. Offline mode (WANDB_MODE=offline) needs no account.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from leakdoctor.trackers.base import COLUMNS, PREFIX, Tracker, finding_record

if TYPE_CHECKING:
    from leakdoctor.reporting.summary import Summary

__all__ = ["WandB"]

#: The step metric the doctor's charts are drawn against (the script's own steps stay the script's).
STEP = PREFIX + "step"
#: The file the summary JSON is saved as, in the run's files.
SUMMARY_FILE = "leakdoctor-summary.json"


def require() -> Any:
    try:
        import wandb
    except ImportError as err:
        raise ImportError("trackers=['wandb'] needs wandb: pip install leakdoctor[wandb]") from err
    return wandb


class WandB(Tracker):
    """Logs to `run` (the script's: never finished here), or to `wandb.run` at the first sample, or to a
    new run, finished at the end."""

    name = "wandb"
    extra = "wandb"

    def __init__(self, run: Any = None, project: str | None = None) -> None:
        self.run, self.project = run, project
        self._own = False
        self._wandb: Any = None

    def open(self) -> None:
        self._wandb = wandb = require()
        if self.run is None:
            self.run = wandb.run
        if self.run is None:
            self.run = wandb.init(project=self.project or os.environ.get("WANDB_PROJECT") or "leakdoctor",
                                  job_type="leakdoctor", reinit="create_new")
            self._own = True
        self.run.define_metric(STEP)
        self.run.define_metric(PREFIX + "*", step_metric=STEP)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._log({STEP: step, **{PREFIX + name: value for name, value in values.items()}})

    def findings(self, step: int, changed: Sequence[Mapping[str, Any]]) -> None:
        self._log({STEP: step, PREFIX + "findings_changed": self._table(changed)})

    def verdict(self, summary: "Summary", plot: Path | None) -> None:
        records = [finding_record(f) for f in summary.findings]
        logged: dict[str, Any] = {STEP: summary.steps, PREFIX + "findings_table": self._table(records)}
        if plot is not None:
            logged[PREFIX + "plot"] = self._wandb.Image(str(plot))
        self._log(logged)
        self.run.summary[PREFIX + "verdict"] = summary.verdict
        self.run.summary[PREFIX + "steps"] = summary.steps
        self.run.summary[PREFIX + "findings_list"] = records
        path = Path(self.run.dir) / SUMMARY_FILE  # the run's files: synced with it
        path.write_text(json.dumps(summary.to_dict(), indent=1, default=str))
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self) -> None:
        if self._own and self.run is not None:
            self.run.finish()

    def _table(self, records: Sequence[Mapping[str, Any]]) -> Any:
        return self._wandb.Table(columns=list(COLUMNS), data=[[r.get(c, "") for c in COLUMNS] for r in records])

    def _log(self, values: Mapping[str, Any]) -> None:
        self.run.log(dict(values), commit=None if self._own else False)
