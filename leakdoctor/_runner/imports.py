"""Patch a framework when the script imports it, not before: a finder first on sys.meta_path watches for
a few module names, lets the usual finders find them, and runs a patch once the module has executed.
Every other import passes through after one dict lookup, and nothing is imported on the script's behalf.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

Patch = Callable[[ModuleType], None]


class PostImport:
    """A meta path finder that calls `patches[name](module)` after module `name` first executes. A patch
    that raises is reported on stderr and the import goes on."""

    def __init__(self, patches: Mapping[str, Patch]) -> None:
        self._patches = dict(patches)

    def install(self) -> None:
        """Patch the watched modules already imported; watch for the others."""
        for name in [n for n in self._patches if n in sys.modules]:
            self._apply(name, sys.modules[name])
        if self._patches:
            sys.meta_path.insert(0, self)  # type: ignore[arg-type]

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # type: ignore[arg-type]

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname not in self._patches:
            return None
        spec = self._find(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec  # a class-level loader (builtins, frozen) is shared: leave it alone
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            del loader.exec_module  # back to the loader's own method
            execute(module)
            self._apply(fullname, module)

        loader.exec_module = exec_module
        return spec

    def _find(self, fullname: str, path: Sequence[str] | None, target: Any) -> Any:
        """The spec the other finders give (this one steps aside)."""
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _apply(self, name: str, module: ModuleType) -> None:
        patch = self._patches.pop(name, None)
        if patch is None:
            return
        try:
            patch(module)
        except Exception as err:  # noqa: BLE001 - a failed patch must not fail the script's import
            print(f"leakdoctor run: could not hook into {name}: {type(err).__name__}: {err}", file=sys.stderr)
