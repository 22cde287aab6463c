"""The processes a `leakdoctor run` script forks: a multiprocessing fork Pool, DataLoader workers under
`fork`, os.fork. A forked child inherits the parent's session, its doctor and its patches; left so, a
child's steps went to a copy of the parent's doctor, whose summary the parent never saw (the parent said
"no step"), and a worker's SIGTERM handler wrote that copy over the parent's summary file.

So in a child (os.register_at_fork) the session starts afresh: a step the child takes attaches a doctor
of its own, quiet, whose summary goes to a file of its own in a folder the parent made for the run
(PID.json). The child's doctor writes it when the child ends: multiprocessing's finalizers at the end of a
worker (doctor.py), the SIGTERM handler of a terminated Pool worker (termination.py), or os._exit, which
the runner wraps for the run (children of multiprocessing end by os._exit). The parent's copies are
the parent's: a child never finishes them (doctor.py, termination.py). At the end the parent reads the
children's summaries and merges them into its own (`merge`): one summary, written once, by the parent,
whose verdict (and `--fail-on-leak`) counts a leak found in any process it watched. Spawned children
(multiprocessing's `spawn`, subprocesses) do not run under leakdoctor and are not watched: the runner
counts the multiprocessing processes started by `spawn` or `forkserver` (`Family.spawned`), so that a run
whose steps ran there is unwatched with that reason, and how to watch them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from typing import Any

from leakdoctor._base.messages import Record, msg
from leakdoctor.reporting.summary import Summary

#: The run in progress in this process (inherited by its forked children), if any.
_current: "Family | None" = None


class Family:
    """The folder of one run's child summaries, and the parent's process id."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.parent = os.getpid()
        self.folder = tempfile.mkdtemp(prefix="leakdoctor-run-")
        #: processes the script started by a method that does not fork ("spawn", "forkserver": they run
        #: the script's code afresh, without leakdoctor): {method: count}
        self.spawned: dict[str, int] = {}
        self._start: Any = None

    def start(self) -> None:
        global _current
        _current = self
        self._watch_starts()

    def stop(self) -> None:
        global _current
        if _current is self:
            _current = None
        if self._start is not None:
            import multiprocessing.process

            multiprocessing.process.BaseProcess.start = self._start
            self._start = None

    def _watch_starts(self) -> None:
        """Count the multiprocessing processes the script starts without a fork (a `spawn` Pool's workers):
        their steps are not watched, and the run's summary says so (`unwatched`'s `spawned`)."""
        import multiprocessing.process

        real = self._start = multiprocessing.process.BaseProcess.start
        spawned = self.spawned

        def start(process: Any) -> None:
            real(process)
            method = getattr(getattr(process, "_popen", None), "method", None)
            if method in ("spawn", "forkserver") and os.getpid() == self.parent:
                spawned[method] = spawned.get(method, 0) + 1

        multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]

    @property
    def in_child(self) -> bool:
        return os.getpid() != self.parent

    def forked(self) -> None:
        """In a new child: a fresh session whose doctor writes to this child's file."""
        self.session.forked(os.path.join(self.folder, f"{os.getpid()}.json"))

    def collect(self) -> list[tuple[int, Summary]]:
        """(process id, summary) of every child that wrote one, in process-id order; an unreadable file is
        skipped with a line on stderr."""
        found = []
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return []
        for name in names:
            stem, ext = os.path.splitext(name)
            if ext != ".json" or not stem.isdigit():
                continue  # a temporary of a write in progress, or killed midway
            try:
                found.append((int(stem), Summary.load(os.path.join(self.folder, name))))
            except Exception as err:  # noqa: BLE001 - one child's bad file must not lose the others
                print(f"leakdoctor run: could not read the summary of child process {stem}: {err}", file=sys.stderr)
        return sorted(found, key=lambda item: item[0])

    def close(self) -> None:
        """Remove the folder (children still running then lose their summary)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _after_fork_in_child() -> None:
    family = _current
    if family is not None and family.in_child:
        family.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def merge(own: Summary | None, children: list[tuple[int, Summary]]) -> Summary | None:
    """The parent's summary with what its children found: every child's findings that the parent's do not
    already hold (one per cause, metric and place), a note per child and per finding it added, and their
    errors. When the parent itself took no step, the summary of the child that took the most is the base."""
    if not children:
        return own
    watched = [(pid, s) for pid, s in children if s.steps]
    notes: list[Record] = []
    base, base_pid = own, os.getpid()
    if (own is None or own.verdict == "unwatched" and not own.steps) and watched:
        base_pid, base = max(watched, key=lambda item: item[1].steps)
        base = dataclasses.replace(base, notes=[msg("in_process", pid=base_pid, note=note) for note in base.notes])
        notes.append(msg("steps_in_children", pid=base_pid))
    if base is None:
        return None
    findings = list(base.findings)
    keys = {f.key for f in findings}
    errors = list(base.errors)
    for pid, child in children:
        if pid == base_pid:
            continue
        for finding in child.findings:
            if finding.key in keys:
                continue
            keys.add(finding.key)
            findings.append(finding)
            notes.append(msg("in_process", pid=pid, note=msg("child_finding", cause=finding.cause,
                                                             metric=finding.metric, state=finding.final_state)))
        errors += [{**e, "part": f"process {pid}: {e.get('part', '')}"} for e in child.errors]
    notes.append(msg("forked_children", count=len(children),
                     children=[{"pid": pid, "steps": s.steps, "verdict": s.verdict} for pid, s in children]))
    return dataclasses.replace(base, findings=findings, notes=[*base.notes, *notes], errors=errors)
