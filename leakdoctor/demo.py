"""`leakdoctor demo`: a real training loop with a planted leak, detected, remedied and verified, with
the summary printed (and written, and plotted when matplotlib is installed)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from leakdoctor.summary import Summary


def _numpy_cycles(steps: int, **doctor_args: object) -> Summary:
    from leakdoctor import LeakDoctor
    from leakdoctor.examples import numpy_cycles

    with LeakDoctor(remedies=numpy_cycles.REMEDIES, **doctor_args) as doctor:
        numpy_cycles.run(doctor.step, steps)
    return doctor.summary


#: name -> (what it shows, module it needs, runner); `demo` runs the first whose framework is installed.
CASES: dict[str, tuple[str, str, Callable[..., Summary]]] = {
    "numpy-cycles": ("reference cycles piling up with gc disabled, fixed by gc_collect", "numpy", _numpy_cycles),
}


def available() -> list[str]:
    found = []
    for name, (_, module, _) in CASES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        found.append(name)
    return found


def run(case: str | None = None, steps: int = 400, out: str | Path = ".") -> Summary:
    """Run one demo case (default: the first available) and write its summary (and plot) to `out`."""
    names = available()
    if case is None:
        if not names:
            raise RuntimeError("no demo case can run here: install numpy or a framework extra")
        case = names[0]
    if case not in CASES:
        raise ValueError(f"unknown demo case {case!r}: choose from {list(CASES)}")
    if case not in names:
        raise RuntimeError(f"demo case {case!r} needs {CASES[case][1]!r}: install leakdoctor's matching extra")
    out = Path(out)
    description, _, runner = CASES[case]
    print(f"leakdoctor demo: {case}: {description}\n", flush=True)
    plot = out / "leakdoctor-demo.png" if _has_matplotlib() else None
    return runner(steps, summary_path=out / "leakdoctor-demo.json", plot_path=plot)


def _has_matplotlib() -> bool:
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True
