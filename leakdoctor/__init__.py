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

The public modules, each with its public names in `__all__` (tests/test_public_api.py checks them):

    leakdoctor                         LeakDoctor, Summary, Finding, LeakDoctorWarning, UnknownOptionError
    leakdoctor.callbacks.torch         plain PyTorch loops (LeakDoctor)
    leakdoctor.callbacks.jax           JAX loops: Flax, Optax, Equinox (LeakDoctor; `.flax` is its older name)
    leakdoctor.callbacks.mlx           MLX loops (LeakDoctor)
    leakdoctor.callbacks.keras         Keras 3 (LeakDoctorCallback)
    leakdoctor.callbacks.lightning     Lightning (LeakDoctorCallback)
    leakdoctor.callbacks.ray           Ray Train (report)
    leakdoctor.settings                the options (OPTIONS, Settings, UnknownOptionError, options_table)
    leakdoctor.integrations            what an integration hands the engine (`integrations=`)
    leakdoctor.reporting.summary       a run's Summary and its Findings (Summary.load reads a file back)
    leakdoctor.reporting.loading       SummaryFileError, what reading a damaged summary file raises
    leakdoctor.remedies                the remedy names and `remedies=` levels
    leakdoctor.remedies.low_precision_init, leakdoctor.remedies.cond_to_where   remedies you may call yourself
    leakdoctor.framework               the framework part (`Framework`) that `LeakDoctor(part=...)` takes

Every other module is internal, and a name that starts with an underscore says so (the module's or its
package's): the ground floor of base types (_base/), the stages built on it (_reading/, _judging/,
_lifecycle/, reporting/_*.py, integrations/_*.py), the engine (_engine.py, _closing.py, _unattended.py,
_options.py) and the runner (_runner/). Besides the modules above, doctor.py (the engine's
front), cli.py, demo.py, examples/, pytest_plugin.py, trackers/ and each remedy's module (named after the
remedy, as `remedies=` names it) keep plain names because something finds them by that name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from leakdoctor._base.version import __version__ as __version__

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ loads each on first use
    from leakdoctor._base.findings import Finding as Finding
    from leakdoctor._base.guard import LeakDoctorWarning as LeakDoctorWarning
    from leakdoctor.doctor import LeakDoctor as LeakDoctor
    from leakdoctor.reporting.summary import Summary as Summary
    from leakdoctor.settings import UnknownOptionError as UnknownOptionError

_EXPORTS = {"LeakDoctor": "leakdoctor.doctor", "LeakDoctorWarning": "leakdoctor._base.guard",
            "Finding": "leakdoctor._base.findings", "Summary": "leakdoctor.reporting.summary",
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
