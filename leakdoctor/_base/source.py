"""The user's code, as seen from inside `doctor.step()`: which files are the user's (not leakdoctor's
engine, not site-packages, not the stdlib), short paths and definition sites for findings, the frame of
the training loop, its local variables (read without keeping anything alive), and lines found in its
source."""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import sys
import sysconfig
from functools import lru_cache
from typing import Any, Callable

__all__ = ["STORES", "is_engine", "is_user_file", "short_path", "code_location", "frame_location",
           "user_frame", "user_site", "caller_frame", "frame_locals", "source_line", "stored_attributes",
           "storing_line", "stored_value", "storing_near", "class_region"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES = os.path.join(_PACKAGE, "examples")
_LIBRARY_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")})


def is_engine(filename: str) -> bool:
    """leakdoctor's own code (its examples are user code: they stand for a user's loop)."""
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE + os.sep) and not path.startswith(_EXAMPLES + os.sep)


def is_engine_module(name: str) -> bool:
    """A module of leakdoctor's own code, by its name (as is_engine: its examples are user code)."""
    return name.startswith("leakdoctor.") and not name.startswith("leakdoctor.examples.")


def is_user_file(filename: str) -> bool:
    """True for the user's own source: not leakdoctor's engine, not site-packages, not the stdlib."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if is_engine(path):
        return False
    if f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path:
        return False
    return not path.startswith(_LIBRARY_DIRS)


def short_path(filename: str) -> str:
    """The path relative to the working directory when it lies inside it."""
    path = os.path.abspath(filename)
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else path


def code_location(obj: Any) -> str | None:
    """'file.py:12' where a function or class is defined, if known."""
    code = getattr(obj, "__code__", None)
    if code is not None:
        return f"{short_path(code.co_filename)}:{code.co_firstlineno}"
    if not inspect.isclass(obj):
        return None
    line = _class_line(obj)
    if line is not None:
        return line
    try:
        return f"{short_path(inspect.getsourcefile(obj) or '?')}:{inspect.getsourcelines(obj)[1]}"
    except (OSError, TypeError):
        return None


def _class_line(cls: type) -> str | None:
    """'file.py:12' where a class with methods is defined: the `class` line above its first method.
    inspect.getsourcelines parses the whole module (15 ms for a test file), which would land in the
    sample that first reads a watched object."""
    codes = [code for value in vars(cls).values()
             if (code := getattr(value, "__code__", None)) is not None and not code.co_filename.startswith("<")]
    if not codes:
        return None
    first = min(codes, key=lambda code: code.co_firstlineno)
    header = f"class {cls.__name__}"
    for line in range(first.co_firstlineno, 0, -1):
        text = linecache.getline(first.co_filename, line).lstrip()
        if text.startswith(header) and text[len(header):len(header) + 1] in ("(", ":"):
            return f"{short_path(first.co_filename)}:{line}"
    return None


def frame_location(frame: Any, line: int | None = None) -> str:
    """'train.py:42': a line in the frame's file (default: the line the frame is at)."""
    return f"{short_path(frame.f_code.co_filename)}:{line or frame.f_lineno}"


def user_frame(frame: Any) -> Any:
    """The innermost frame of the user's own code from `frame` outwards (skipping leakdoctor, the
    frameworks in site-packages and the stdlib), or None: the line of the user's program that led to
    what runs in `frame` (the call of a jitted function that made jax trace and compile it again)."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_site(frame: Any = None) -> str | None:
    """'train.py:42': where the user's code stands, from `frame` (default: the caller's) outwards."""
    found = user_frame(frame if frame is not None else sys._getframe(1))
    return frame_location(found) if found is not None else None


def caller_frame() -> Any:
    """The innermost frame outside leakdoctor's engine: the training loop that called doctor.step()."""
    frame = sys._getframe(1)
    while frame is not None and is_engine(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def frame_locals(frame: Any) -> dict[str, Any]:
    """A copy of a frame's local variables that keeps nothing alive. Before Python 3.13 a function
    frame's f_locals is a snapshot the frame keeps, with every object it names, until the next access:
    it would hold one step's arrays (gradients, activations, graphs) for as long as the loop runs. So
    the snapshot is emptied after the copy; module frames (f_locals is the namespace itself) and 3.13+
    (a live view) are left alone."""
    f_locals = frame.f_locals
    names = dict(f_locals)
    if sys.version_info < (3, 13) and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        f_locals.clear()
    return names


@lru_cache(maxsize=32)
def _parse(filename: str, size: int) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def _nodes_of(code: Any) -> list[ast.AST]:
    """The syntax nodes inside `code`'s function (or module), from its file's source; none where that
    cannot be parsed."""
    tree = _parse(code.co_filename, len(linecache.getlines(code.co_filename)))
    if tree is None:
        return []
    lines = [line for _, _, line in code.co_lines() if line is not None]
    first, last = code.co_firstlineno, max(lines, default=code.co_firstlineno)
    return [n for n in ast.walk(tree) if first <= getattr(n, "lineno", 0) <= last]


def source_line(code: Any, wanted: Callable[[ast.AST], bool]) -> int | None:
    """The first line inside `code`'s function (or module) where a node satisfies `wanted`."""
    return min((n.lineno for n in _nodes_of(code) if wanted(n)), default=None)


#: Methods that store into a container.
STORES = frozenset({"append", "appendleft", "extend", "extendleft", "insert", "add", "update", "setdefault"})


def _names(node: ast.AST, name: str) -> bool:
    """Is `node` the variable or attribute `name` (`name`, `self.name`, `trainer.name`)?"""
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _stored_into(node: ast.AST) -> list[ast.AST]:
    """What a node stores into: `x` of `x.append(...)` (or another storing method), of `x[key] = ...` and
    of `x += ...` / `x[key] += ...`; none for other nodes."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STORES:
        return [node.func.value]
    if isinstance(node, ast.Assign):
        return [t.value for t in node.targets if isinstance(t, ast.Subscript)]
    if isinstance(node, ast.AugAssign):
        return [node.target.value if isinstance(node.target, ast.Subscript) else node.target]
    return []


def _stores_into(node: ast.AST, name: str) -> bool:
    """`name.append(...)` (or another storing method), `name[key] = ...`, `name += ...`."""
    return any(_names(target, name) for target in _stored_into(node))


def stored_attributes(code: Any) -> list[tuple[str, int]]:
    """(attribute, line) of each store in a method's code into an attribute of its first argument, in
    line order: `self.samples.append(x)`, `self.cache[key] = x`, `self.seen += [x]`; what the method
    keeps on its object each time it runs."""
    if not code.co_varnames or code.co_argcount < 1:
        return []
    owner = code.co_varnames[0]
    found = {(target.attr, node.lineno) for node in _nodes_of(code) for target in _stored_into(node)
             if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == owner}
    return sorted(found, key=lambda f: f[1])


def storing_line(filename: str, first: int, last: int, name: str) -> int | None:
    """The first line between `first` and `last` of a file where the code stores into `name` (appends to
    it, sets an item, adds to it in place): where what a holder keeps comes from."""
    tree = _parse(filename, len(linecache.getlines(filename)))
    if tree is None or not name.isidentifier():
        return None
    return min((n.lineno for n in _stores(tree, first, last, name)), default=None)


def calling_line(filename: str, first: int, last: int, name: str) -> int | None:
    """The first line between `first` and `last` where the code hands a variable to a method of `name`
    (`log.debug("loss %s", loss)`, not `log.setLevel(logging.DEBUG)`): where a library's object that `name`
    refers to is given what it keeps."""
    tree = _parse(filename, len(linecache.getlines(filename)))
    if tree is None or not name.isidentifier():
        return None
    calls = [n.lineno for n in ast.walk(tree) if first <= getattr(n, "lineno", 0) <= last and isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and _names(n.func.value, name) and _hands_a_variable(n)]
    return min(calls, default=None)


def _hands_a_variable(call: ast.Call) -> bool:
    """Does the call pass a variable (`loss`, `*outputs`, `value=loss`) as an argument?"""
    values = [a.value if isinstance(a, ast.Starred) else a for a in call.args] + [k.value for k in call.keywords]
    return any(isinstance(v, ast.Name) for v in values)


def stored_value(filename: str, first: int, last: int, name: str) -> str | None:
    """The code of what the first store into `name` between `first` and `last` stores: `out.mean()` of
    `activations.append(out.mean())`, `loss` of `total += loss`, in parentheses where it is an operation
    (`(a + b)`), so that the fix texts quote the user's own expression."""
    tree = _parse(filename, len(linecache.getlines(filename)))
    if tree is None or not name.isidentifier():
        return None
    for node in sorted(_stores(tree, first, last, name), key=lambda n: (n.lineno, n.col_offset)):
        value = (node.args[0] if node.args else None) if isinstance(node, ast.Call) else node.value
        if value is not None:
            text = ast.unparse(value)
            return text if isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else f"({text})"
    return None


def _stores(tree: ast.Module, first: int, last: int, name: str) -> list[ast.AST]:
    """The nodes between lines `first` and `last` that store into `name`."""
    return [n for n in ast.walk(tree) if first <= getattr(n, "lineno", 0) <= last and _stores_into(n, name)]


def _enclosing(tree: ast.Module, line: int) -> tuple[int, int] | None:
    """First and last line of the innermost function that contains `line`; None at module level."""
    best: tuple[int, int] | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            first, last = node.lineno, getattr(node, "end_lineno", None) or node.lineno
            if first <= line <= last and (best is None or last - first < best[1] - best[0]):
                best = (first, last)
    return best


def storing_near(filename: str, line: int, name: str) -> int | None:
    """The line of the code around `line` (its function; at module level, the module) that stores into
    `name`: the statement at `line` if it does (`self.history.append(bytearray(n))`, over several lines
    too), else the first such line after it (an object made, then appended), else the last one before it.
    None when the code there does not store into `name`."""
    if not name.isidentifier() or not is_user_file(filename):
        return None
    tree = _parse(filename, len(linecache.getlines(filename)))
    if tree is None:
        return None
    first, last = _enclosing(tree, line) or (1, sys.maxsize)
    stores = _stores(tree, first, last, name)
    spanning = [n.lineno for n in stores if n.lineno <= line <= (getattr(n, "end_lineno", None) or n.lineno)]
    if spanning:
        return max(spanning)
    hits = sorted({n.lineno for n in stores})
    after = [n for n in hits if n >= line]
    return after[0] if after else (hits[-1] if hits else None)


def class_region(cls: type) -> tuple[str, int, int] | None:
    """(file, first line, last line) of a class's source, if it can be read."""
    try:
        lines, first = inspect.getsourcelines(cls)
        return inspect.getsourcefile(cls) or "?", first, first + len(lines) - 1
    except (OSError, TypeError):
        return None
