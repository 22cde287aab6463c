"""Which names an entry point takes, checked when it is built: the options (leakdoctor.settings.OPTIONS)
plus its own keyword arguments (`model=`, `optimizer=`, `log_prefix=`, ...). A misspelt name is an
UnknownOptionError that suggests the nearest valid one, the same at every entry point; a bad value is a
ValueError at construction, not at the first fit."""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Mapping

from leakdoctor.settings import NAMES, Settings, reject_unknown

#: Not an option of the table: extra probes and forensics, which the framework doctors pass in.
ENGINE_ONLY = ("integrations",)


def keywords(cls: type) -> set[str]:
    """The keyword arguments of every __init__ along `cls`'s classes (`**options` left out)."""
    named = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and inspect.isfunction(init):
            named |= {name for name, p in inspect.signature(init).parameters.items()
                      if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name != "self"}
    return named


def refuse_unknown(cls: type, options: Mapping[str, Any], own: Iterable[str] = ()) -> None:
    """Raise UnknownOptionError for a name that is neither an option nor a keyword argument of `cls`."""
    reject_unknown(f"{cls.__module__}.{cls.__qualname__}", options, NAMES | keywords(cls) | set(own))


def check(cls: type, options: Mapping[str, Any], own: Iterable[str] = ()) -> Settings:
    """A callback's check at construction: refuse unknown names (those of `cls` and `own` are valid),
    validate the values as its doctors will, and return the settings they make."""
    refuse_unknown(cls, options, {*own, *ENGINE_ONLY})
    integrations = options.get("integrations", ())
    from leakdoctor._base.integration import Integration

    if isinstance(integrations, (str, bytes)) or not isinstance(integrations, Iterable) \
            or not all(isinstance(part, Integration) for part in integrations):
        raise ValueError(f"{cls.__name__}: integrations={integrations!r}: expected a list of "
                         f"leakdoctor.integrations.Integration")
    return Settings.create(**{name: value for name, value in options.items() if name in NAMES})
