"""The framework doctors are built by composition (issue #39): one engine, a framework part handed over.

The structure is read from the source with `ast`: no class in leakdoctor/callbacks/ overrides a private
method of the engine or reads its private state, and no module of the doctor (doctor.py, _engine.py,
_closing.py, _unattended.py, framework.py) or of callbacks/ reaches into another object's private attributes
(`x._name` with `x` not `self`/`cls`) or swaps an object's `__dict__` (the stand-in doctor). Then the
protocol itself, on the plain doctor: a part's completion, emission, words, and an engine that finishes a
doctor nobody holds any more.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import json
from pathlib import Path

from leakdoctor import LeakDoctor
from leakdoctor.framework import Ending, Framework

PACKAGE = Path(__file__).resolve().parent.parent / "leakdoctor"
#: The modules of the doctor itself, besides callbacks/.
DOCTOR_MODULES = ("doctor.py", "_engine.py", "_closing.py", "_unattended.py", "framework.py")
#: Private names that may be read on an object that is not self: none.
EXCEPTIONS: dict[str, str] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _sources(root: Path) -> dict[str, ast.Module]:
    files = [root / name for name in DOCTOR_MODULES] + sorted((root / "callbacks").glob("*.py"))
    return {str(path.relative_to(root)): ast.parse(path.read_text()) for path in files if path.exists()}


def _engine_class(root: Path) -> ast.ClassDef:
    tree = ast.parse((root / "doctor.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LeakDoctor")


def engine_private_names(root: Path) -> set[str]:
    """The engine's private methods and attributes: those the public LeakDoctor defines or sets on self."""
    names = set()
    for node in ast.walk(_engine_class(root)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
            names.add(node.name)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and _private(node.attr):
            names.add(node.attr)
    return names


def _base_name(base: ast.expr) -> str:
    return base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""


def doctor_classes(root: Path) -> list[tuple[str, ast.ClassDef]]:
    """Classes of callbacks/ that derive from the engine, directly or through another such class."""
    classes = [(f"callbacks/{path.name}", node) for path in sorted((root / "callbacks").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]
    known, found = {"LeakDoctor"}, {}
    while True:
        new = {(where, node.name): node for where, node in classes
               if (where, node.name) not in found and any(_base_name(b) in known for b in node.bases)}
        if not new:
            return [(where, node) for (where, _), node in found.items()]
        found.update(new)
        known |= {name for _, name in new}


def overrides(root: Path) -> list[str]:
    """Each private method of the engine that a framework class defines again, and each private name of
    the engine's that it uses on self (`self._guard`, `getattr(self, "_unattended")`)."""
    engine = engine_private_names(root)
    found = []
    for where, cls in doctor_classes(root):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in engine:
                found.append(f"{where}: {cls.name}.{node.name} overrides the engine's")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and node.attr in engine:
                found.append(f"{where}:{node.lineno}: {cls.name} uses the engine's self.{node.attr}")
            if _named_getattr(node, "self") in engine:
                found.append(f"{where}:{node.lineno}: {cls.name} uses the engine's {_named_getattr(node, 'self')}")
    return found


def _named_getattr(node: ast.AST, owner: str | None = None) -> str | None:
    """The constant name of a getattr/setattr/hasattr call (on `owner` if given, else on anything else
    than self/cls), else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return None
    target = node.args[0].id if isinstance(node.args[0], ast.Name) else None
    if (owner is None and target in ("self", "cls")) or (owner is not None and target != owner):
        return None
    return node.args[1].value


def private_reaches(root: Path) -> list[str]:
    """Every `x._name` (and getattr(x, "_name")) whose `x` is not self/cls, and every use of `__dict__`."""
    found = []
    for where, tree in _sources(root).items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if node.attr == "__dict__":
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)} (an object's state handed around)")
                elif _private(node.attr) and owner not in ("self", "cls") \
                        and f"{ast.unparse(node)}" not in EXCEPTIONS:
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            name = _named_getattr(node)
            if name is not None and _private(name):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_framework_class_overrides_the_engines_private_methods_or_reads_its_state():
    assert doctor_classes(PACKAGE), "the framework doctors derive from the engine's public class"
    assert overrides(PACKAGE) == []


def test_no_module_of_the_doctor_reaches_into_another_objects_private_state():
    assert private_reaches(PACKAGE) == []


def test_the_structure_checks_see_what_they_look_for(tmp_path):
    """The checks find an override, a private reach and a stand-in in code that has them (as the doctor
    before composition did: callbacks/torch.py's _complete, doctor.py's stand-in)."""
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "doctor.py").write_text(
        "class LeakDoctor:\n"
        "    def __init__(self):\n        self._guard = 1\n"
        "    def _complete(self, summary):\n        return summary\n"
        "def _stand_in(cls, state):\n    doctor = cls.__new__(cls)\n    doctor.__dict__ = state\n"
        "    doctor._unattended = 'exit'\n")
    (tmp_path / "callbacks" / "torch.py").write_text(
        "from leakdoctor import doctor\n"
        "class LeakDoctor(doctor.LeakDoctor):\n"
        "    def _complete(self, summary):\n        return getattr(self, '_guard', None)\n"
        "class Lightning(LeakDoctor):\n"
        "    def step(self):\n        return self._guard\n")
    assert len(overrides(tmp_path)) == 3
    assert [line.split(": ", 1)[1] for line in private_reaches(tmp_path)] == [
        "doctor.__dict__ (an object's state handed around)", "doctor._unattended"]


# --- the protocol, on the plain doctor ---------------------------------------------------------------


def test_a_framework_part_completes_and_emits_the_summary(tmp_path):
    endings: list[Ending] = []

    def complete(summary, ending):
        endings.append(ending)
        return dataclasses.replace(summary, rank=7)

    part = Framework(name="mine", complete=complete, emits=lambda summary, ending: False)
    doctor = LeakDoctor(part=part, summary_path=tmp_path / "leaks.json", verbose=False)
    for _ in range(30):
        doctor.step()
    summary = doctor.finish()
    assert (summary.framework, summary.rank, summary.steps) == ("mine", 7, 30)
    assert [(e.steps, e.unattended, e.exception, e.stopped_together) for e in endings] == [(30, None, None, False)]
    assert not (tmp_path / "leaks.json").exists()  # the part said the doctor does not emit it
    assert doctor.finish() is summary and len(endings) == 1


def test_a_framework_part_continues_every_summary_and_leaves_forensics_out():
    seen = []
    part = Framework(name="mine", continues=lambda summary: dataclasses.replace(summary, rank=3),
                     leaves_out=("tracemalloc",), stop_agreement=lambda: seen.append("asked"))
    doctor = LeakDoctor(part=part, verbose=False, on_limit="stop")
    doctor.step()
    assert doctor.summary.rank == 3 and doctor.finish().rank == 3
    assert seen == ["asked"]  # asked once, at construction, when on_limit="stop"


def _dropped(path: Path, endings: list[Ending]) -> None:
    part = Framework(name="mine", complete=lambda summary, ending: endings.append(ending) or summary)
    doctor = LeakDoctor(part=part, summary_path=path, verbose=False)
    for _ in range(12):
        doctor.step()


def test_a_dropped_doctors_engine_finishes_its_run(tmp_path):
    """No stand-in: what finishes a doctor nobody holds is its engine, which never held the doctor."""
    endings: list[Ending] = []
    _dropped(tmp_path / "leaks.json", endings)
    gc.collect()
    assert [(e.unattended, e.steps) for e in endings] == [("collected", 12)]
    assert json.loads((tmp_path / "leaks.json").read_text())["steps"] == 12


def test_quiet_step_counts_the_steps_with_nothing_to_do_and_leaves_the_others_to_step(tmp_path):
    """The helper a doctor that prepares work for step() (the JAX doctor) calls first: a step it counts is
    one step of the run and is never sampled; the steps it leaves are taken by step()."""
    doctor = LeakDoctor(summary_path=tmp_path / "leaks.json", verbose=False)
    counted, left = set(), set()
    for step in range(1, 301):
        if doctor.quiet_step():
            counted.add(step)
        else:
            doctor.step()
            left.add(step)
    summary = doctor.finish()
    assert summary.steps == doctor.steps == 300
    assert counted and left
    sampled = {step for step, _ in summary.series["rss_bytes"].points} - {300}  # finish() may sample the last
    assert sampled and not sampled & counted, sorted(sampled & counted)
