"""Experiment trackers: the doctor's series, its findings as they change state and the final verdict, sent to
TensorBoard, MLflow or Weights & Biases, into the run the script already has open or a new one.

    LeakDoctor(trackers=["tensorboard"])              # a new SummaryWriter under ./runs
    LeakDoctor(trackers=[writer])                      # the script's own SummaryWriter
    LeakDoctor(trackers=["mlflow", "wandb"])           # the active MLflow / W&B run, else a new one
    leakdoctor run --tracker tensorboard train.py

Each tracker is a small class (one module each: tensorboard.py, mlflow.py, wandb.py) with the four methods of
`base.Tracker`; it imports its library only when it opens, so this package imports no tracker and no
framework. The engine feeds them from where it already publishes to the Prometheus exporter (feed.Feed has
the exporter's `publish`), one way: engine -> feed -> trackers. A tracker that fails (its library missing, a
disk full, a server gone) is reported once and switched off; the training run goes on.

This module holds only what settings.py needs to check the `trackers=` option at construction: the names,
and which objects are trackers (recognized by their class's module, without importing any library).
"""

from __future__ import annotations

import difflib
from typing import Any

__all__ = ["NAMES", "resolve", "adapt", "Tracker", "TensorBoard", "MLflow", "WandB"]

#: The classes, imported on first use (`from leakdoctor.trackers import MLflow`): each module imports its
#: library only when a tracker opens, but this package stays free of them all the same.
_CLASSES = {"Tracker": "base", "TensorBoard": "tensorboard", "MLflow": "mlflow", "WandB": "wandb"}

#: The tracker names `trackers=` and `--tracker` take, with the extra each needs.
NAMES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}

#: The modules whose objects are the script's own runs or writers, and the tracker that takes each.
_OBJECTS = (("torch.utils.tensorboard", "tensorboard"), ("tensorboardX", "tensorboard"),
            ("mlflow", "mlflow"), ("wandb", "wandb"))


def resolve(value: Any) -> tuple[Any, ...]:
    """The `trackers=` option, checked: a name, a tracker object, or a list of them; None or [] for none.
    Names are lower-cased and kept once; objects are kept as given (opened at the first sample).

    Raises:
        ValueError: an unknown name (with the nearest valid one), or an object that is no tracker.
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)) else list(value)
    resolved: list[Any] = []
    for item in items:
        item = _name(item) if isinstance(item, str) else _object(item)
        if not any(item is seen or (isinstance(item, str) and item == seen) for seen in resolved):
            resolved.append(item)
    return tuple(resolved)


def _name(text: str) -> str:
    name = text.strip().lower()
    if name in NAMES:
        return name
    close = difflib.get_close_matches(name, list(NAMES), n=1, cutoff=0.5)
    hint = f" did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"trackers: unknown tracker {text!r}:{hint} (valid: {', '.join(sorted(NAMES))}, or a "
                     f"SummaryWriter, an MLflow run or a W&B run the script has open)")


def _object(item: Any) -> Any:
    if kind_of(item) is None:
        raise ValueError(f"trackers: {type(item).__name__} object {item!r:.60}: expected a tracker name "
                         f"({', '.join(sorted(NAMES))}), a SummaryWriter (torch.utils.tensorboard or tensorboardX), "
                         f"an MLflow run, a W&B run, or a leakdoctor.trackers.base.Tracker")
    return item


def kind_of(item: Any) -> str | None:
    """'tracker' for a leakdoctor Tracker, the tracker name for a writer or run of a tracker's library, else
    None (by the class's module: no library is imported to tell)."""
    from leakdoctor.trackers.base import Tracker

    if isinstance(item, Tracker):
        return "tracker"
    module = type(item).__module__ or ""
    return next((name for prefix, name in _OBJECTS if module == prefix or module.startswith(prefix + ".")), None)


def adapt(item: Any) -> Any:
    """The Tracker for a resolved item: a name makes a new one (a new writer or run, unless the script
    has one open), a writer or run is wrapped, a Tracker is itself."""
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
