"""`leakdoctor run [options] script.py [args...]`: run a training script unedited, with a doctor attached
at its framework's natural step, and write the summary at the end (also on an exception, Ctrl-C and
SIGTERM).

The script runs in this process as `python script.py args` would run it (script.py). Frameworks are
patched only when the script imports them (imports.py, frameworks.py: each framework's eager step, and
the functions the script compiles with mx.compile, jax.jit, flax.nnx.jit or equinox.filter_jit,
compiled.py), or the step is a function the user names (step_on.py, which replaces the automatic steps);
the first step seen attaches one doctor (session.py), with the run's options. A run in which no step
was seen is not called clean: its summary (written, printed) has the verdict "unwatched", with the
reason and the fix (--step-on). Nothing is printed on a clean run but the doctor's summary, on stderr;
the exit status is the script's, or 1 with `fail_on_leak` when the script succeeded and the verdict is
"leak" (or, with fail_on_leak="minor", a minor finding was made); an unwatched run keeps the script's
status.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Mapping, Sequence

from leakdoctor.runner import frameworks, script, step_on
from leakdoctor.runner.imports import PostImport
from leakdoctor.runner.script import Outcome
from leakdoctor.runner.session import Session


def run(path: str, args: Sequence[str], options: Mapping[str, Any], *, on_limit: str | None = None,
        step: str | None = None, fail_on_leak: str | None = None, relaunch: Sequence[str] = ()) -> Outcome:
    """Run the script at `path`; how it ended, with `code` the exit status to use. `options`: the
    doctor's (remedies, summary_path, ...); `step`: a --step-on target; `relaunch`: the leakdoctor
    arguments before the script, for DDP ranks Lightning starts as subprocesses."""
    if not os.path.isfile(path):
        print(f"leakdoctor run: can't open file {os.path.abspath(path)!r}: no such file", file=sys.stderr)
        return Outcome(2)
    session = Session(options, on_limit)
    target = step_on.Target.parse(step) if step else None
    transform = None
    if target is None:
        hook = PostImport(frameworks.patches(session, list(relaunch)))
    elif target.module == step_on.MAIN:
        step_on.activate(session, target)
        hook = PostImport({})
        transform = functools.partial(step_on.rewrite, name=target.path[0])
    else:
        hook = PostImport({target.module: functools.partial(step_on.patch_module, session, target)})
    hook.install()
    try:
        outcome = script.run(path, list(args), transform)
    finally:
        hook.uninstall()
    reason = None
    if target is not None:
        reason = (f"--step-on {target}: the function never returned" if step_on.wrapped else
                  f"--step-on {target}: the script never defined it")
    summary = _finish(session, outcome, reason)
    if fail_on_leak and not outcome.failed and summary is not None and summary.fails(fail_on_leak):
        outcome.code = 1
    return outcome


def _finish(session: Session, outcome: Outcome, reason: str | None = None) -> Any:
    """The session's summary; an exception other than a successful SystemExit is noted in it. `reason`:
    why no step was seen, when none was (--step-on)."""
    exception = outcome.exception
    if isinstance(exception, SystemExit) and not outcome.failed:
        exception = None
    try:
        return session.finish(exception, reason)
    except Exception as err:  # noqa: BLE001 - the script's own exit status stands
        print(f"leakdoctor run: could not finish the doctor: {type(err).__name__}: {err}", file=sys.stderr)
        return None
