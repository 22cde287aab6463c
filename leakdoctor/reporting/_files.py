"""Writing a file so that a reader never sees half of it (the summary, the HTML page)."""

from __future__ import annotations

import glob
import os
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["write_atomic", "remove_stale", "now_iso", "STALE_SECONDS"]


#: A temporary file of a write older than this (a write takes milliseconds) and older than this process
#: was left by a writer killed in the middle (SIGKILL, power loss); the next write removes it.
STALE_SECONDS = 60.0
_LOADED = time.time()


def now_iso() -> str:
    """The time now as ISO 8601, local time with its UTC offset, to the second: '2025-01-31T14:03:07+01:00'."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a reader never sees half
    a file. The file's mode is what the umask makes of 0666, as for open(). Stale temporary files of
    earlier writes to `path` that were killed are removed first."""
    remove_stale(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale(path: Path) -> None:
    """Remove the temporary files of writes to `path` that were killed before they renamed them."""
    cutoff = min(time.time() - STALE_SECONDS, _LOADED)
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
        except OSError:  # gone already, or not ours to remove: the write goes on
            continue
