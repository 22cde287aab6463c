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
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {"LeakDoctor": "leakdoctor.doctor", "LeakDoctorWarning": "leakdoctor.lifecycle.guard",
            "Finding": "leakdoctor.reporting.summary", "Summary": "leakdoctor.reporting.summary",
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
