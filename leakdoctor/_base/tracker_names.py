"""The trackers' names and what `trackers=` takes: what the settings check a `trackers=` value against at
construction, on the ground floor so that the settings need not import the trackers (leakdoctor/trackers/
opens each by name). Writers and runs of a tracker's library are told by their class's module, and a
tracker of the user's by its methods: nothing is imported to tell."""

from __future__ import annotations

import difflib
from typing import Any

__all__ = ["NAMES", "METHODS", "resolve", "kind_of"]

#: The names `trackers=` and `leakdoctor run --tracker` take; each is also the extra that installs it.
NAMES = ("tensorboard", "mlflow", "wandb")
#: The methods of a tracker (leakdoctor.trackers.Tracker): an object with all of them is one.
METHODS = ("open", "scalars", "findings", "verdict", "close")
#: The modules whose objects are the script's own writers or runs, and the tracker that takes each.
LIBRARIES = (("torch.utils.tensorboard", "tensorboard"), ("tensorboardX", "tensorboard"), ("mlflow", "mlflow"),
             ("wandb", "wandb"))


def resolve(value: Any) -> tuple[Any, ...]:
    """The `trackers=` option, checked: a name, a tracker object, or a list of them; None or [] for none.
    Names are lower-cased and kept once; objects are kept as given (opened at the first step).

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


def kind_of(item: Any) -> str | None:
    """The tracker name for a writer or run of a tracker's library (by its class's module), "tracker" for
    an object with a tracker's methods, else None."""
    module = type(item).__module__ or ""
    found = next((name for prefix, name in LIBRARIES if module == prefix or module.startswith(prefix + ".")), None)
    if found is None and all(callable(getattr(item, method, None)) for method in METHODS):
        return "tracker"
    return found


def _name(text: str) -> str:
    name = text.strip().lower()
    if name in NAMES:
        return name
    close = difflib.get_close_matches(name, NAMES, n=1, cutoff=0.5)
    hint = f" did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"trackers: unknown tracker {text!r}:{hint} (valid: {', '.join(NAMES)}, or a SummaryWriter, "
                     f"an MLflow run or a W&B run the script has open)")


def _object(item: Any) -> Any:
    if kind_of(item) is None:
        raise ValueError(f"trackers: {type(item).__name__} object {item!r:.60}: expected a tracker name "
                         f"({', '.join(NAMES)}), a SummaryWriter (torch.utils.tensorboard or tensorboardX), an "
                         f"MLflow run, a W&B run, or a leakdoctor.trackers.Tracker")
    return item
