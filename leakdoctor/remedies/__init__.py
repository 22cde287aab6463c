"""The remedy registry: names, the `remedies=` levels (_base/remedy_names.py, which the settings check against),
and lazy loading (one module per remedy).

A remedy module is imported only when a finding calls for it, so `import leakdoctor` imports no
framework. Each module exposes its class as `REMEDY`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from leakdoctor._base.remedy_names import INVASIVE, LEVELS, NAMES, SAFE, resolve

if TYPE_CHECKING:
    from leakdoctor.remedies._base import Remedy

__all__ = ["SAFE", "INVASIVE", "NAMES", "LEVELS", "resolve", "load"]


def load(name: str) -> "type[Remedy]":
    """The remedy class registered under `name`."""
    if name not in NAMES:
        raise ValueError(f"unknown remedy {name!r}: valid names are {NAMES}")
    return importlib.import_module(f"leakdoctor.remedies.{name}").REMEDY
