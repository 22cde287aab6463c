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
status. The processes the script forks are watched too (children.py): their doctors' summaries are merged
into the one the parent writes, so a leak in any of them is the run's. A script that ends by os._exit
still gets its summary: os._exit is wrapped for the run (in the parent it ends the run first; in a forked
child, it finishes the child's doctor).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Mapping, Sequence

from leakdoctor._lifecycle import termination
from leakdoctor._runner import children, frameworks, script, step_on
from leakdoctor._runner.imports import PostImport
from leakdoctor._runner.script import Outcome
from leakdoctor._runner.session import Session


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
    family = children.Family(session)
    end = functools.partial(_end, session, family, target, fail_on_leak)
    real_exit = os._exit
    os._exit = functools.partial(_os_exit, family, session, end, real_exit)
    hook.install()
    family.start()
    # on SIGTERM (the doctors finish, then the process ends by the signal), the children's folder goes too
    termination.register(family, lambda exception: family.close(), install=False)
    try:
        outcome = script.run(path, list(args), transform)
    finally:
        termination.unregister(family)
        family.stop()
        hook.uninstall()
        os._exit = real_exit
    return end(outcome)


def _end(session: Session, family: children.Family, target: Any, fail_on_leak: str | None, outcome: Outcome) -> Outcome:
    """End the run: the summary (with the children's), and the exit status with `fail_on_leak`. In a
    forked child that returned through the runner (os.fork), only the child's doctor is finished."""
    if family.in_child:
        session.finish_child()
        return outcome
    reason = None
    if target is not None:
        reason = (f"--step-on {target}: the function never returned" if step_on.wrapped else
                  f"--step-on {target}: the script never defined it")
    summary = _finish(session, outcome, family, reason)
    if fail_on_leak and not outcome.failed and summary is not None and summary.fails(fail_on_leak):
        outcome.code = 1
    return outcome


def _finish(session: Session, outcome: Outcome, family: children.Family, reason: str | None = None) -> Any:
    """The session's summary, merged with the forked children's; an exception other than a successful
    SystemExit is noted in it. `reason`: why no step was seen, when none was (--step-on)."""
    exception = outcome.exception
    if isinstance(exception, SystemExit) and not outcome.failed:
        exception = None
    reports = family.collect()
    try:
        if not reports:
            return session.finish(exception, reason, spawned=family.spawned)
        quiet = session.quiet()
        own = session.finish(exception, reason, emit=False, spawned=family.spawned)
        summary = children.merge(own, reports)
        if summary is not None:
            if quiet:
                session.emit(summary)
            else:  # a callback wrote its own: the merged one replaces it
                rank, path, _ = session.destination()
                if path:
                    summary.write(path)
                    if rank == 0:
                        print(f"leakdoctor run: {len(reports)} forked child process(es) were watched too; "
                              f"{path} holds their findings (verdict {summary.verdict})", file=sys.stderr)
        return summary
    except Exception as err:  # noqa: BLE001 - the script's own exit status stands
        print(f"leakdoctor run: could not finish the doctor: {type(err).__name__}: {err}", file=sys.stderr)
        return None
    finally:
        family.close()


def _os_exit(family: children.Family, session: Session, end: Any, real_exit: Any, status: int) -> None:
    """os._exit for the run: the parent ends the run first (the summary; `--fail-on-leak` may turn a 0
    into 1); a forked child finishes its own doctor (multiprocessing's children end this way)."""
    try:
        if family.in_child:
            session.finish_child()
        else:
            family.stop()
            status = _status(end(Outcome(status, SystemExit(status) if status else None)).code, status)
            sys.stderr.flush()
    except BaseException as err:  # noqa: BLE001 - the process ends here whatever happened
        print(f"leakdoctor run: could not finish at os._exit: {type(err).__name__}: {err}", file=sys.stderr)
    real_exit(status)


def _status(code: Any, default: int) -> int:
    return code if isinstance(code, int) else default
