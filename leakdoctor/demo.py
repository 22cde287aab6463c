"""`leakdoctor demo`: a real training loop with a planted leak, detected, remedied and verified, with
the summary printed (and written, and plotted when matplotlib is installed). Each case lives in
leakdoctor/examples/ and builds its doctor exactly as a user would."""

from __future__ import annotations

import importlib
from pathlib import Path

from leakdoctor.reporting.summary import Summary

#: name -> (what it shows, the framework it needs); `demo` runs the first one that is installed.
CASES: dict[str, tuple[str, str]] = {
    "mlx-lazy": ("MLX state never evaluated: the lazy graph chains across steps; force_eval fixes it", "mlx"),
    "torch-hooks": ("a forward hook registered every step; remove_hooks drops the repeats", "torch"),
    "numpy-cycles": ("reference cycles piling up with gc disabled; gc_collect fixes it", "numpy"),
}


def available() -> list[str]:
    found = []
    for name, (_, module) in CASES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        found.append(name)
    return found


def run(case: str | None = None, steps: int | None = None, out: str | Path = ".") -> Summary:
    """Run one demo case (default: the first available) and write its summary (and plot) to `out`."""
    names = available()
    if case is None:
        if not names:
            raise RuntimeError("no demo case can run here: install numpy or a framework extra")
        case = names[0]
    if case not in CASES:
        from leakdoctor.settings import did_you_mean

        raise ValueError(f"unknown demo case {case!r}: choose from {list(CASES)}" + did_you_mean(case, CASES))
    if case not in names:
        raise RuntimeError(f"demo case {case!r} needs {CASES[case][1]!r}: install leakdoctor's matching extra")
    out = Path(out)
    print(f"leakdoctor demo: {case}: {CASES[case][0]}\n", flush=True)
    example = importlib.import_module(f"leakdoctor.examples.{case.replace('-', '_')}")
    plot = out / "leakdoctor-demo.png" if _has_matplotlib() else None
    extra = {"steps": steps} if steps else {}
    return example.train(summary_path=out / "leakdoctor-demo.json", plot_path=plot, **extra)


def _has_matplotlib() -> bool:
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True
