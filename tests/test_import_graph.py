"""The package's import graph, read from its source with `ast`: every import counts, those under
`if TYPE_CHECKING:` and those inside a function included (a type-only or a late import still ties two
modules together for whoever reads or changes them).

The floors, bottom to top (a module's floor is its first name under leakdoctor/; the package root is the
top floor, beside the entry points):

    0  _base         the ground floor: metric spec, probe, evidence, rule, guard, finding, remedy outcome,
                     series summary, trend statistics, the schema, units, the user's code, remedy names
    1  settings      the options a doctor takes (they check `remedies=` against _base/remedy_names.py)
    2  _reading      probes read, series kept (_reading/monitor.py only reads and reports values)
    3  integrations  one module per framework: probes, forensics, cleanups, rules (the process integration
                     reads the memory limit, integrations/_limits.py)
    4  remedies      what can be done about a finding (they act on the integrations' targets)
    5  _judging      suspicion, investigation, diagnosis, treatment: the clinic applies the remedies
    6  reporting     the summary built from what the reading and the judging hold
    7  _lifecycle    the run itself: stopping at the limit, heartbeat, SIGTERM, out of memory
    8  engine        doctor.py (the LeakDoctor engine, with _engine.py, _closing.py, _unattended.py and
                     framework.py) and _options.py (which names an entry point takes)
    9  callbacks     the framework entry points
    10 _runner       `leakdoctor run`
    11 entry points  cli.py, pytest_plugin.py, demo.py, examples/, __main__.py and the package root

Each module imports only modules of its own floor or of floors below it, and no two modules import each
other, however indirectly. The ground floor imports nothing of leakdoctor beyond itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "leakdoctor"

FLOORS: tuple[tuple[str, ...], ...] = (
    ("_base",),
    ("settings", "_option_types"),
    ("_reading",),
    ("integrations",),
    ("remedies",),
    ("_judging",),
    ("reporting",),
    ("_lifecycle", "trackers"),
    ("framework", "_engine", "_closing", "_unattended", "doctor", "_options"),
    ("callbacks",),
    ("_runner",),
    ("cli", "pytest_plugin", "demo", "examples", "__main__", ""),
)


def modules(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package's __init__)} of every module of the package."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The package's modules one import statement of module `name` imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    found = set()
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        found.add(sub if sub in known else module)
    return found & known


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, every import statement anywhere in the file."""
    found = modules(package)
    known = set(found)
    edges: dict[str, set[str]] = {}
    for name, (path, is_package) in found.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= _targets(name, is_package, node, known)
        edges[name] = targets - {name}
    return edges


def floor(module: str) -> int:
    """The floor of a module of the package (FLOORS)."""
    first = module.split(".")[1] if "." in module else ""
    for number, names in enumerate(FLOORS):
        if first in names:
            return number
    raise AssertionError(f"{module} is on no floor: add its folder or file to FLOORS")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return graph()


def test_every_module_is_on_a_floor(edges):
    unplaced = [module for module in edges if module != "leakdoctor" and
                module.split(".")[1] not in {name for names in FLOORS for name in names}]
    assert unplaced == []


def test_no_module_imports_one_of_a_higher_floor(edges):
    upward = sorted(f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})"
                    for module, targets in edges.items() for target in targets if floor(target) > floor(module))
    assert not upward, "\n".join(upward)


def test_no_two_modules_import_each_other(edges):
    found = cycles(edges)
    assert not found, "\n".join(" <-> ".join(component) for component in found)


def test_the_ground_floor_imports_nothing_of_the_package_beyond_itself(edges):
    outside = sorted(f"{module} imports {target}" for module, targets in edges.items()
                     if module.startswith("leakdoctor._base") for target in targets
                     if not target.startswith("leakdoctor._base"))
    assert not outside, "\n".join(outside)
    assert [module for module in edges if module.startswith("leakdoctor._base.")], "no ground floor found"


def test_the_reader_sees_every_kind_of_import(tmp_path):
    """The graph counts type-only imports, imports inside functions, relative imports and `from package
    import submodule`; a cycle made of them is found."""
    package = tmp_path / "leakdoctor"
    (package / "_base").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_base" / "__init__.py").write_text("")
    (package / "_base" / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                           "if TYPE_CHECKING:\n    from leakdoctor._judging import b\n")
    (package / "_judging").mkdir()
    (package / "_judging" / "__init__.py").write_text("")
    (package / "_judging" / "b.py").write_text("def f():\n    from .._base import a\n    return a\n")
    found = graph(package)
    assert found["leakdoctor._base.a"] == {"leakdoctor._judging.b"}
    assert found["leakdoctor._judging.b"] == {"leakdoctor._base.a"}
    assert cycles(found) == [["leakdoctor._base.a", "leakdoctor._judging.b"]]
    assert floor("leakdoctor._judging.b") > floor("leakdoctor._base.a")
