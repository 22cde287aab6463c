"""Run a Python file as `python script.py args` would: `sys.argv` is `[script, *args]`, `sys.path[0]` the
script's folder, the script runs as module `__main__` (with `__file__` absolute, as Python 3.9+ sets
it), and an uncaught exception prints the script's own traceback (through `sys.excepthook`, without
leakdoctor's frames) for exit status 1."""

from __future__ import annotations

import ast
import builtins
import io
import os
import sys
import types
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from typing import Any, Callable


@dataclass
class Outcome:
    """How the script ended: `code` as SystemExit carries it (None or 0: success), and the exception
    that ended it, if any (KeyboardInterrupt included; its traceback is already printed)."""

    code: Any = None
    exception: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.code not in (None, 0)


def compile_script(path: str, transform: Callable[[ast.Module], ast.Module] | None = None) -> types.CodeType:
    """The script's code object, its syntax tree first passed through `transform` if given."""
    with io.open_code(path) as fh:
        source = fh.read()
    if transform is None:
        return compile(source, path, "exec", dont_inherit=True)
    tree = transform(ast.parse(source, path))
    return compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True)


def main_module(path: str) -> types.ModuleType:
    """A fresh `__main__` for the script, with the attributes Python gives a script's module."""
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None, __spec__=None,
                           __package__=None, __annotations__={},
                           __loader__=SourceFileLoader("__main__", path))
    return module


def run(script: str, args: list[str], transform: Callable[[ast.Module], ast.Module] | None = None) -> Outcome:
    """Run `script` with `args` in this process; how it ended. The process keeps the script's
    `sys.argv`, `sys.path[0]` and `__main__` afterwards, as a script run by Python would."""
    path = os.path.abspath(script)
    sys.argv[:] = [script, *args]
    sys.path[0:1] = [os.path.dirname(os.path.realpath(path))]
    try:
        code = compile_script(path, transform)
    except SyntaxError as err:  # printed as Python prints it: no traceback, the line and a caret
        _print_uncaught(err.with_traceback(None))
        return Outcome(1, err)
    module = main_module(path)
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - running the user's script is the point
    except SystemExit as exit_:
        return Outcome(exit_.code, exit_)
    except BaseException as exc:  # noqa: BLE001 - report it as Python would, then let the caller end
        _print_uncaught(exc)
        return Outcome(1, exc)
    return Outcome()


def _print_uncaught(exc: BaseException) -> None:
    """The traceback Python prints for an uncaught exception, starting at the script's frame."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is run.__code__:
        tb = tb.tb_next
        exc.with_traceback(tb)  # the default hook prints the exception's own traceback, not its argument
    try:
        sys.excepthook(type(exc), exc, tb)
    except Exception:  # noqa: BLE001 - a broken excepthook: Python falls back to the default one
        sys.__excepthook__(type(exc), exc, tb)
