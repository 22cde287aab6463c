"""The options a callback hands on to its doctors, checked when the callback is built: a misspelt name is
a ValueError that names it and the valid ones (not a TypeError at the first fit), and every value is
validated as the doctor would. The valid names are read from LeakDoctor's own signature, so an option the
engine gains is valid for every callback at once."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping

from leakdoctor.doctor import LeakDoctor
from leakdoctor.integrations import Integration
from leakdoctor.settings import Settings


def _keywords(fn: Callable[..., Any]) -> set[str]:
    return {name for name, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name != "self"}


def check(where: str, options: Mapping[str, Any], own: Iterable[str] = ()) -> Settings:
    """Refuse option names that neither LeakDoctor nor the callback (`own`) takes; validate the values;
    return the settings they make."""
    valid = _keywords(LeakDoctor.__init__) | set(own)
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; valid options: {sorted(valid)}")
    integrations = options.get("integrations", ())
    if isinstance(integrations, (str, bytes)) or not isinstance(integrations, Iterable) \
            or not all(isinstance(part, Integration) for part in integrations):
        raise ValueError(f"{where}: integrations={integrations!r}: expected a list of "
                         f"leakdoctor.integrations.Integration")
    settings = _keywords(Settings.create)
    return Settings.create(**{name: value for name, value in options.items() if name in settings})
