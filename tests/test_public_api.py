"""The public boundary: the modules the package's docstring names as public each say their public names in
`__all__`, and every one of those names is there; the package root's names are visible to type checkers
(explicit re-exports under TYPE_CHECKING) and still load on first use; `leakdoctor.callbacks.jax` is the JAX
loop doctor's module with `leakdoctor.callbacks.flax` its older name; and no code cites a file that is not
in the repository."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "leakdoctor"

#: The public modules (as the package's docstring lists them).
PUBLIC = ("leakdoctor", "leakdoctor.callbacks.torch", "leakdoctor.callbacks.jax", "leakdoctor.callbacks.flax",
          "leakdoctor.callbacks.mlx", "leakdoctor.callbacks.keras", "leakdoctor.callbacks.lightning",
          "leakdoctor.callbacks.ray", "leakdoctor.settings", "leakdoctor.integrations",
          "leakdoctor.reporting.summary", "leakdoctor.reporting.loading", "leakdoctor.remedies",
          "leakdoctor.remedies.low_precision_init", "leakdoctor.remedies.cond_to_where", "leakdoctor.framework")
#: Importing these loads a framework that takes tens of seconds (Lightning) or needs a backend chosen for
#: the whole process (Keras): their names are checked in the source only.
HEAVY = ("leakdoctor.callbacks.keras", "leakdoctor.callbacks.lightning")


def path_of(module: str) -> Path:
    relative = Path(*module.split("."))
    package = ROOT / relative / "__init__.py"
    return package if package.exists() else (ROOT / relative).with_suffix(".py")


def declared(module: str) -> list[str]:
    """The names in the module's `__all__`, read from its source (a literal list or tuple of strings)."""
    tree = ast.parse(path_of(module).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


def bound(module: str) -> set[str]:
    """The names the module binds at its top level (definitions, assignments, imports, also under `if`)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
    visit(ast.parse(path_of(module).read_text(encoding="utf-8")).body)
    return names


@pytest.mark.parametrize("module", PUBLIC)
def test_each_public_module_names_its_public_names_in_all(module):
    names = declared(module)
    assert names and len(names) == len(set(names)), names
    assert sorted(set(names) - bound(module)) == [], f"in {module}.__all__ but not defined there"


@pytest.mark.parametrize("module", [m for m in PUBLIC if m not in HEAVY])
def test_every_public_name_imports(module):
    loaded = importlib.import_module(module)
    assert list(loaded.__all__) == declared(module)
    missing = [name for name in loaded.__all__ if not hasattr(loaded, name)]
    assert missing == []


def test_the_package_docstring_names_every_public_module():
    import leakdoctor

    assert all(module in leakdoctor.__doc__ for module in PUBLIC if module != "leakdoctor.callbacks.flax")


def test_the_package_root_re_exports_its_names_for_type_checkers_and_loads_them_on_first_use():
    """Under TYPE_CHECKING, each public name is imported `as` itself (an explicit re-export) from the module
    the lazy loader takes it from; at run time, `import leakdoctor` loads none of them."""
    tree = ast.parse(path_of("leakdoctor").read_text(encoding="utf-8"))
    typed = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                for alias in stmt.names:
                    assert alias.asname == alias.name, f"{alias.name}: not an explicit re-export"
                    typed[alias.name] = stmt.module
    import leakdoctor

    assert typed == leakdoctor._EXPORTS
    assert set(leakdoctor.__all__) == set(typed) | {"__version__"}
    code = ("import json, sys, leakdoctor; print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('leakdoctor', 'numpy', 'psutil'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == ["leakdoctor", "leakdoctor._base", "leakdoctor._base.version"]
    from leakdoctor.doctor import LeakDoctor
    from leakdoctor.reporting.summary import Finding, Summary

    assert (leakdoctor.LeakDoctor, leakdoctor.Summary, leakdoctor.Finding) == (LeakDoctor, Summary, Finding)


def test_the_jax_loop_doctor_is_importable_by_both_names():
    from leakdoctor.callbacks import flax, jax

    assert jax.LeakDoctor is flax.LeakDoctor
    assert jax.__all__ == flax.__all__ == ["LeakDoctor"]
    assert "Equinox" in jax.__doc__ and "Optax" in jax.__doc__


def test_no_code_cites_a_file_that_is_not_in_the_repository():
    """A comment or docstring that cites DESIGN.md sends the reader to a file they cannot open."""
    citing = [str(path.relative_to(ROOT)) for path in sorted(PACKAGE.rglob("*.py"))
              if "DESIGN.md" in path.read_text(encoding="utf-8")]
    assert not (ROOT / "DESIGN.md").exists()
    assert citing == []
