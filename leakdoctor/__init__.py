"""leakdoctor: drop-in training callbacks that tell a real memory leak from warm-up, caches and spikes,
name its cause and place, apply a remedy when allowed, verify it, and write a leak summary.

    from leakdoctor import LeakDoctor
    with LeakDoctor(remedies="safe", summary_path="leaks.json") as doctor:
        for batch in data:
            train_step(batch)
            doctor.step()

Framework callbacks live in `leakdoctor.callbacks.<framework>`; no framework is imported here, and the
names below load on first use, so `leakdoctor run` imports nothing (not even numpy) before the script
it runs does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from leakdoctor.base.version import __version__ as __version__

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ loads each on first use
    from leakdoctor.base.findings import Finding as Finding
    from leakdoctor.base.guard import LeakDoctorWarning as LeakDoctorWarning
    from leakdoctor.doctor import LeakDoctor as LeakDoctor
    from leakdoctor.reporting.summary import Summary as Summary
    from leakdoctor.settings import UnknownOptionError as UnknownOptionError

_EXPORTS = {"LeakDoctor": "leakdoctor.doctor", "LeakDoctorWarning": "leakdoctor.base.guard",
            "Finding": "leakdoctor.base.findings", "Summary": "leakdoctor.reporting.summary",
            "UnknownOptionError": "leakdoctor.settings"}
__all__ = ["LeakDoctor", "LeakDoctorWarning", "Finding", "Summary", "UnknownOptionError", "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'leakdoctor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
