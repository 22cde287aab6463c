"""`--step-on module:function`: a step is a return from that function, for scripts whose step is none of
the frameworks' (a numpy loop, a step in an installed package, a whole jitted loop). `function` may be a
dotted path (`Trainer.step`); without `module:` (or with `__main__:`) it is the script's own. With it,
the automatic steps (frameworks.py) are off.

The wrapper keeps the original as `__wrapped__` (functools.wraps): the doctor's own calls, such as
force_eval's `mx.eval` under `--step-on mlx.core:eval`, go to the original (inspect.unwrap), and a call
made while the doctor steps (session.depth > 0) is no step either, so the doctor never re-enters itself.

A function of an imported module is wrapped when that module is imported. The script's own is wrapped
right after the statement that defines it runs: the script's syntax tree gets, after each top-level
statement binding the name, one call back into this module (on that statement's last line, so every
line number and traceback stays the script's).
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from leakdoctor._runner.session import Session

MAIN = "__main__"
_CALL = "__import__('leakdoctor._runner.step_on', fromlist=['patch_main']).patch_main()"


@dataclass(frozen=True)
class Target:
    module: str
    path: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> "Target":
        """`module:qual.name`, `__main__:name` or `name`; ValueError for anything else."""
        module, sep, qualname = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
        module = module if sep else MAIN
        path = tuple(qualname.split("."))
        if not all(p.isidentifier() for p in path) or not all(p.isidentifier() for p in module.split(".")):
            raise ValueError(f"--step-on {spec!r}: expected module:function, module:Class.method or a function "
                             f"of the script, e.g. train:train_step")
        return cls(module, path)

    def __str__(self) -> str:
        return f"{self.module}:{'.'.join(self.path)}"


_active: tuple[Session, Target] | None = None
wrapped: list[str] = []  # what has been wrapped so far (the runner says so if it stays empty)


def activate(session: Session, target: Target) -> None:
    global _active
    _active = (session, target)
    wrapped.clear()


def patch_module(session: Session, target: Target, module: ModuleType) -> None:
    """Wrap the target in `module` (it must be there once the module has run)."""
    owner: Any = module
    for name in target.path[:-1]:
        owner = getattr(owner, name)
    name = target.path[-1]
    raw = inspect.getattr_static(owner, name)
    if isinstance(raw, (staticmethod, classmethod)):
        setattr(owner, name, type(raw)(_stepping(session, raw.__func__)))
    elif callable(raw):
        setattr(owner, name, _stepping(session, raw))
    else:
        raise TypeError(f"--step-on {target}: {type(raw).__name__} is not a function")
    wrapped.append(str(target))


def patch_main() -> None:
    """Called from the script right after it bound the target's first name."""
    if _active is None:
        return
    session, target = _active
    try:
        patch_module(session, target, sys.modules[MAIN])
    except Exception as err:  # noqa: BLE001 - the script runs on, unwatched
        print(f"leakdoctor run: could not wrap {target}: {type(err).__name__}: {err}", file=sys.stderr)


def _stepping(session: Session, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, stepping the run's doctor after each outermost call returns."""
    if getattr(fn, "__leakdoctor_step_on__", False):
        return fn

    @functools.wraps(fn)
    def step_on(*args: Any, **kwargs: Any) -> Any:
        session.depth += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            session.depth -= 1
        if session.depth == 0:
            doctor = session.attach("step_on", _doctor)
            if doctor is not None:
                session.depth += 1  # what the doctor calls (force_eval's mx.eval) is no step: no recursion
                try:
                    session.step(doctor)
                finally:
                    session.depth -= 1
        return result

    step_on.__leakdoctor_step_on__ = True  # type: ignore[attr-defined]
    return step_on


def _doctor(**options: Any) -> Any:
    """The doctor of the framework the script imported (MLX, JAX, torch), else the plain one."""
    if "mlx.core" in sys.modules:
        from leakdoctor.callbacks.mlx import LeakDoctor
    elif "jax" in sys.modules:
        from leakdoctor.callbacks.jax import LeakDoctor
    elif "torch" in sys.modules:
        from leakdoctor.callbacks.torch import LeakDoctor
    else:
        from leakdoctor.doctor import LeakDoctor
    return LeakDoctor(**options)


def rewrite(tree: ast.Module, name: str) -> ast.Module:
    """`tree` with a call to patch_main() after every module-level statement that binds `name`."""
    tree.body = _insert(tree.body, name)
    return tree


def _insert(body: list[ast.stmt], name: str) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in body:
        for field in ("body", "orelse", "finalbody"):
            if isinstance(stmt, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)) \
                    and isinstance(getattr(stmt, field, None), list):
                setattr(stmt, field, _insert(getattr(stmt, field), name))
        for handler in getattr(stmt, "handlers", []) if isinstance(stmt, ast.Try) else []:
            handler.body = _insert(handler.body, name)
        out.append(stmt)
        if _binds(stmt, name):
            out.append(_call_at(stmt.end_lineno or stmt.lineno))
    return out


def _binds(stmt: ast.stmt, name: str) -> bool:
    """Whether `stmt` itself (not a function body inside it) binds `name` at module level."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name == name
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in stmt.names)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))
    return False


def _call_at(line: int) -> ast.stmt:
    call = ast.parse(_CALL).body[0]
    for node in ast.walk(call):
        if "lineno" in node._attributes:
            node.lineno = node.end_lineno = line  # type: ignore[attr-defined]
            node.col_offset = node.end_col_offset = 0  # type: ignore[attr-defined]
    return call
