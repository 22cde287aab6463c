"""The corpus harness: runs one scenario in one mode, in this process, and writes what it saw as JSON.

    .venv/bin/python benchmarks/scenarios/_harness.py torch_hooks detect /tmp/out.json

A scenario is a module in this folder with `TRUTH` (its ground truth) and `run(h)`: a real training loop
that builds its doctor with `h.doctor(...)` (or `h.callbacks(...)`) and calls `h.tick()` at the end of
every step. The mode decides what watches the loop:

  detect       leakdoctor, remedies="off"
  remedy       leakdoctor, remedies="all"
  objgraph     objgraph.growth() every `check` steps from the end of warm-up (no doctor)
  tracemalloc  tracing on from the end of the first step (the first step's one-time imports, torch's
               dynamo alone, would make each diff take seconds), a snapshot diff every `check` steps

Outside the doctor modes `h.doctor(...)` hands back a stand-in that does nothing, so the loop is the
same code in every mode. Every mode records this process's resident memory after every step; the
runner applies the series rules (a fixed threshold, stormlog) to the detect run's series. Doctor
settings are the same for every scenario: the defaults, plus a fixed memory limit (materiality is
judged against the headroom to it, which would otherwise depend on the machine's RAM).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import random
import sys
import time
import tracemalloc
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

MODES = ("detect", "remedy", "objgraph", "tracemalloc")
DOCTOR_MODES = {"detect": "off", "remedy": "all"}
#: The same for every scenario: a fixed limit, so that a growth's materiality does not depend on the
#: RAM of the machine; everything else is leakdoctor's default.
DOCTOR_OPTIONS: dict[str, Any] = {"memory_limit": "8GiB", "verbose": False}
#: Lines a tracemalloc diff shows per look, and types an objgraph look keeps.
TOP = 10
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Truth:
    """What a scenario is, decided from how it is written, never from what a tool reports.

    leak: does memory (or a resource the run depends on) grow without bound? cause: the leakdoctor cause
    a correct diagnosis names (for a benign scenario, a benign finding it should make, e.g.
    allocator_cache, or None). location: substrings, any of which a correct location contains.
    remedy: the leakdoctor remedy that fixes it, None where none exists. start: the number of steps
    before the leak begins (before the benign growth, for a benign scenario). steps: the loop's length;
    remedy_steps: its length in the remedy run, which must also verify the remedy (default: steps).
    step: what a step is. warmup: the steps every tool ignores (the doctor's warm-up in these steps);
    check: steps between two looks of objgraph, tracemalloc and stormlog; settle: steps after a remedy
    before the slope after it is measured (two of the doctor's windows in these steps).
    """

    leak: bool
    cause: str | None
    framework: str
    what: str
    source: str
    steps: int
    start: int = 0
    location: tuple[str, ...] = ()
    remedy: str | None = None
    remedy_steps: int | None = None
    step: str = "training step"
    warmup: int = 20
    check: int = 10
    settle: int = 12


def marker(file: str, tag: str) -> str:
    """'name.py:12': the line of `file` that ends with the comment `# <tag>`."""
    path = Path(file)
    lines = path.read_text(encoding="utf-8").splitlines()
    number = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {tag}"))
    return f"{path.name}:{number}"


def seed(value: int = 0) -> None:
    """Seed Python's and numpy's generators (frameworks are seeded by the scenario)."""
    random.seed(value)
    np.random.seed(value)


class Absent:
    """Stands in for the doctor outside the doctor modes: the loop calls it as it would call a doctor."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.tx = options.get("tx")

    def step(self, state: Any = None, /, **context: Any) -> Any:
        return state

    def watch(self, *args: Any, **kwargs: Any) -> None:
        pass

    def watch_object(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> "Absent":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


class Harness:
    """What a scenario's loop talks to: the doctor (or its stand-in), the per-step recorder, and the
    looks of objgraph or tracemalloc."""

    def __init__(self, mode: str, length: int, warmup: int = 20, check: int = 10,
                 on_limit: str = "warn") -> None:
        from leakdoctor.integrations._process import RssReader

        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        self.mode = mode
        self.on_limit = on_limit  # "stop" in the stability runs: a clean run must never be stopped
        self.length = length  # the steps the loop runs
        self.warmup, self.check = warmup, check
        self.steps = 0
        self.rss = np.full(length + 64, np.nan)  # preallocated: the recorder itself must not grow
        self.ends = np.full(length + 64, np.nan)
        self.looks: list[tuple[int, tuple]] = []
        self.doctors: list[Any] = []
        self._read_rss = RssReader()
        self._peaks: dict[str, int] = {}
        self._snapshot: Any = None
        self.started = time.perf_counter()

    @property
    def remedies(self) -> str | None:
        """The doctor's remedies setting in this mode, None when no doctor runs."""
        return DOCTOR_MODES.get(self.mode)

    def doctor(self, factory: Callable[..., Any], **kwargs: Any) -> Any:
        """`factory(**kwargs)` with the mode's remedies and the corpus options, or a stand-in."""
        if self.remedies is None:
            return Absent(kwargs)
        made = factory(remedies=self.remedies, on_limit=self.on_limit, **DOCTOR_OPTIONS, **kwargs)
        self.doctors.append(made)
        return made

    def callbacks(self, factory: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """A framework callback doctor as a list for `callbacks=` (the same instance on every call), or
        an empty list outside the doctor modes."""
        if self.remedies is None:
            return []
        if not self.doctors:
            self.doctor(factory, **kwargs)
        return [self.doctors[0]]

    def tick(self) -> None:
        """The end of one step: record resident memory and the time; look when a look is due."""
        i = self.steps
        if i < len(self.rss):
            self.rss[i] = self._read_rss()
            self.ends[i] = time.perf_counter()
        self.steps = i + 1
        if self.mode == "tracemalloc" and self.steps == 1:
            tracemalloc.start()
        if self.mode in ("objgraph", "tracemalloc") and self.steps >= self.warmup \
                and (self.steps - self.warmup) % self.check == 0:
            look = self._look_objgraph() if self.mode == "objgraph" else self._look_tracemalloc()
            self.looks.append((self.steps, tuple(look)))  # tuples of str and int: gc stops tracking them

    def _look_objgraph(self) -> list[tuple[str, int]]:
        """objgraph.growth(): types whose live count rose above their previous peak, after the
        gc.collect() objgraph runs itself. The first look, at the end of warm-up, sets the peaks."""
        import objgraph

        grown = objgraph.growth(limit=TOP, peak_stats=self._peaks)
        return [(name, int(delta)) for name, _, delta in grown]

    def _look_tracemalloc(self) -> list[tuple[str, int, int]]:
        """A snapshot diffed against the previous look's by line (tracemalloc's usual 'lineno' view): the
        lines whose traced memory grew most, the harness's and tracemalloc's own lines left out."""
        snapshot = tracemalloc.take_snapshot()
        previous, self._snapshot = self._snapshot, snapshot
        if previous is None:
            return []
        grown = []
        for stat in snapshot.compare_to(previous, "lineno"):
            frame = stat.traceback[0]
            if stat.size_diff > 0 and not frame.filename.endswith(("_harness.py", "tracemalloc.py")):
                grown.append((f"{frame.filename}:{frame.lineno}", int(stat.size_diff), int(stat.count_diff)))
                if len(grown) == TOP:
                    break
        return grown

    def result(self) -> dict[str, Any]:
        """What the runner scores: the recorded series, the tool's looks and the doctor's summary."""
        n = min(self.steps, len(self.rss))
        ends = self.ends[:n]
        summaries = []
        for doctor in self.doctors:
            # loop doctors and the Keras callback finish here; the Lightning callback finished at train end
            summary = doctor.finish() if hasattr(doctor, "finish") else doctor.summary
            summaries.append(summary.to_dict() if summary is not None else None)
        return {
            "mode": self.mode,
            "steps": self.steps,
            "rss": [float(v) for v in self.rss[:n]],
            "step_seconds": [float(v) for v in np.diff(ends)],
            "looks": [{"step": step, "grown": [list(g) for g in grown]} for step, grown in self.looks],
            "summary": summaries[0] if summaries else None,
        }


def load(name: str) -> Any:
    """The scenario module `name` from this folder."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(name)


def run_one(name: str, mode: str, on_limit: str = "warn") -> dict[str, Any]:
    """Import the scenario (and its frameworks), start the mode's tool, run the loop, collect."""
    seed(0)
    module = load(name)
    truth: Truth = module.TRUTH
    length = (truth.remedy_steps or truth.steps) if mode == "remedy" else truth.steps
    h = Harness(mode, length, truth.warmup, truth.check, on_limit)
    begin, cpu = time.perf_counter(), time.process_time()
    extra = module.run(h)
    wall, cpu = time.perf_counter() - begin, time.process_time() - cpu
    result = h.result()
    if mode == "tracemalloc":
        tracemalloc.stop()
    gc.collect()
    return {"scenario": name, "truth": asdict(truth), **result, "wall_seconds": wall, "cpu_seconds": cpu,
            "extra": extra or {}}


def main(argv: list[str]) -> int:
    name, mode, out, *on_limit = argv  # on_limit: "warn" (the default) or "stop"
    os.chdir(HERE.parent.parent)  # locations are reported relative to the repository root
    try:
        result = run_one(name, mode, *on_limit)
    except BaseException:  # noqa: BLE001 - the runner reports a failed scenario, it does not crash
        result = {"scenario": name, "mode": mode, "error": traceback.format_exc()}
    Path(out).write_text(json.dumps(result), encoding="utf-8")
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    import _harness  # the scenarios import this module by name: one copy of it, not two

    sys.exit(_harness.main(sys.argv[1:]))
