"""Experiment trackers: the doctor's series, its findings as they change state and the final verdict, sent to
TensorBoard, MLflow or Weights & Biases, into the run the script already has open or a new one.

    LeakDoctor(trackers=["tensorboard"])              # a new SummaryWriter under ./runs
    LeakDoctor(trackers=[writer])                      # the script's own SummaryWriter
    LeakDoctor(trackers=["mlflow", "wandb"])           # the active MLflow / W&B run, else a new one
    leakdoctor run --tracker tensorboard train.py

Each tracker is a small class (one module each: tensorboard.py, mlflow.py, wandb.py) with the methods of
`base.Tracker`; it imports its library only when it opens, so this package imports no tracker and no
framework. The engine feeds them from where it already publishes to the Prometheus exporter (feed.Feed has
the exporter's `publish`), one way: engine -> feed -> trackers. A tracker that fails (its library missing, a
disk full, a server gone) is reported once and switched off; the training run goes on. What `trackers=`
takes is checked by the settings, against the ground floor's leakdoctor/_base/tracker_names.py.
"""

from __future__ import annotations

from typing import Any

from leakdoctor._base.tracker_names import NAMES, kind_of, resolve

__all__ = ["NAMES", "resolve", "adapt", "Tracker", "TensorBoard", "MLflow", "WandB"]

#: The classes, imported on first use (`from leakdoctor.trackers import MLflow`): each module imports its
#: library only when a tracker opens, but this package stays free of them all the same.
_CLASSES = {"Tracker": "base", "TensorBoard": "tensorboard", "MLflow": "mlflow", "WandB": "wandb"}


def adapt(item: Any) -> Any:
    """The Tracker for a resolved `trackers=` item: a name makes a new one (a new writer or run, unless the
    script has one open when it opens), a writer or run is wrapped, a tracker is itself."""
    kind = item if isinstance(item, str) else kind_of(item)
    if kind == "tracker":
        return item
    given = None if isinstance(item, str) else item
    if kind == "tensorboard":
        from leakdoctor.trackers.tensorboard import TensorBoard

        return TensorBoard(writer=given)
    if kind == "mlflow":
        from leakdoctor.trackers.mlflow import MLflow

        return MLflow(run=given)
    from leakdoctor.trackers.wandb import WandB

    return WandB(run=given)


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_CLASSES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
