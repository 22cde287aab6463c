"""Test helpers for real subprocesses: scripts run by this checkout's leakdoctor, output read while they
run, bounded waits."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def env(**extra: str) -> dict[str, str]:
    """This process's environment with this checkout first on the path, one BLAS thread, quiet TF/JAX."""
    result = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                  OPENBLAS_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    result.update(extra)
    return result


def leakdoctor_run(*args: str | os.PathLike[str]) -> list[str]:
    """The command line of `python -m leakdoctor run ARGS`."""
    return [sys.executable, "-m", "leakdoctor", "run", *map(str, args)]


def run(command: Sequence[str | os.PathLike[str]], cwd: Path, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env(**extra), capture_output=True, text=True,
                          timeout=timeout)


class Watched:
    """A subprocess whose stdout and stderr are collected line by line while it runs."""

    def __init__(self, command: Sequence[str | os.PathLike[str]], cwd: Path, **extra: str) -> None:
        self.process = subprocess.Popen([str(c) for c in command], cwd=cwd, env=env(**extra), text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                         for name, stream in (("out", self.process.stdout), ("err", self.process.stderr))]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put((name, line))

    def wait_for(self, text: str, stream: str = "out", timeout: float = 120) -> None:
        """Collect output until a line of `stream` contains `text`; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                name, line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            (self.out if name == "out" else self.err).append(line)
            if name == stream and text in line:
                return
        self.kill()
        raise AssertionError(f"no {text!r} on std{stream} (exit {self.process.returncode}):\n"
                             f"{''.join(self.out)}\n{''.join(self.err)}")

    def finish(self, timeout: float = 60) -> int:
        """Wait for the exit (killing it after `timeout`), collect the rest of the output; the exit status."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        for reader in self._readers:
            reader.join(timeout=10)
        while not self.lines.empty():
            name, line = self.lines.get()
            (self.out if name == "out" else self.err).append(line)
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)
