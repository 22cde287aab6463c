"""The out-of-memory killer (issue #23): a leaking training loop in a memory cgroup of its own, made here
(v2 `memory.max` or v1 `memory.limit_in_bytes`, whichever the machine has), grows until the kernel
SIGKILLs it; the summary on disk names the leak and its line, and says that memory was about to run out
(`"oom": {"imminent": true}`), written when resident memory passed `oom_watermark` of the cgroup's limit.
Skipped, with the reason, where no cgroup can be made (not root, a read-only cgroupfs, no memory
controller). The cgroup is removed afterwards."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers import counts, place

from procs import SCRIPTS, Watched

SCRIPT = SCRIPTS / "heartbeat_loop.py"
MIB = 2**20
#: The cgroup's memory limit and what the loop keeps a step: the kernel kills it some 50 steps in, after
#: an investigation (warm-up 5, windows of 3, every step sampled) named the line around step 31.
LIMIT_MIB, CHUNK_MIB = 320, 4


def own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path in the v1 hierarchy of `controller`, or in v2's (None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if (controller is None and hierarchy == "0") or (controller and controller in controllers.split(",")):
            return path
    return None


def mounts() -> list[tuple[str, Path]]:
    """(kind, mount point) of the memory hierarchies: ("v2", ...) for cgroup2, ("v1", ...) for v1 memory."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        fstype, options = fields[dash + 1], fields[dash + 3].split(",")
        if fstype == "cgroup2":
            found.append(("v2", Path(fields[4])))
        elif fstype == "cgroup" and "memory" in options:
            found.append(("v1", Path(fields[4])))
    return found


class Cgroup:
    """A memory cgroup made for one test, with a memory limit and no swap; `remove()` takes it away."""

    def __init__(self, folder: Path, kind: str) -> None:
        self.folder, self.kind = folder, kind

    @classmethod
    def make(cls, limit: int) -> "Cgroup":
        """A new cgroup under this process's own (so that the limits above still hold), else at the root
        of the hierarchy; pytest.skip with every reason when none can be made."""
        reasons = []
        for kind, mount in mounts():
            own = own_cgroup(None if kind == "v2" else "memory")
            parents = ([mount / own.lstrip("/")] if own and own != "/" else []) + [mount]
            for parent in parents:
                try:
                    return cls._made(parent / f"leakdoctor-oom-test-{os.getpid()}", kind, limit)
                except OSError as err:
                    reasons.append(f"{kind} under {parent}: {err.strerror or err}")
        pytest.skip("no memory cgroup can be made here: " + ("; ".join(reasons) or "no memory cgroup hierarchy"))

    @classmethod
    def _made(cls, folder: Path, kind: str, limit: int) -> "Cgroup":
        if kind == "v2":
            controllers = (folder.parent / "cgroup.controllers").read_text().split()
            if "memory" not in controllers:
                raise OSError(f"no memory controller in {folder.parent}/cgroup.controllers")
            if "memory" not in (folder.parent / "cgroup.subtree_control").read_text().split():
                (folder.parent / "cgroup.subtree_control").write_text("+memory")
        folder.mkdir()
        cgroup = cls(folder, kind)
        try:
            if kind == "v2":
                (folder / "memory.max").write_text(str(limit))
                if (folder / "memory.swap.max").exists():
                    (folder / "memory.swap.max").write_text("0")
            else:
                (folder / "memory.limit_in_bytes").write_text(str(limit))
                if (folder / "memory.memsw.limit_in_bytes").exists():  # swap accounting: no swap either
                    (folder / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    @property
    def oom_kills(self) -> int | None:
        """The kernel's count of OOM kills in the cgroup, where it says (v2 memory.events, newer v1 oom_control)."""
        name = "memory.events" if self.kind == "v2" else "memory.oom_control"
        try:
            rows = dict(line.split() for line in (self.folder / name).read_text().splitlines())
        except (OSError, ValueError):
            return None
        return int(rows["oom_kill"]) if "oom_kill" in rows else None

    def remove(self) -> None:
        """Remove the folder once the processes in it are gone (the kernel may take a moment to let go)."""
        for _ in range(50):
            try:
                self.folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        self.folder.rmdir()


@pytest.fixture
def cgroup():
    made = Cgroup.make(LIMIT_MIB * MIB)
    try:
        yield made
    finally:
        made.remove()


def test_a_run_the_kernel_kills_out_of_memory_leaves_its_post_mortem(tmp_path, cgroup):
    path = tmp_path / "leaks.json"
    watched = Watched([sys.executable, SCRIPT, "leak", tmp_path, str(CHUNK_MIB), "1000", cgroup.folder],
                      cwd=tmp_path)
    try:
        status = watched.finish(timeout=120)
    finally:
        watched.kill()
    assert status == -signal.SIGKILL, f"exit {status} (3: not moved into {cgroup.folder}):\n{watched.stdout}\n" \
                                      f"{watched.stderr}"
    assert cgroup.oom_kills in (None, 1)  # the kernel's OOM killer, where the cgroup counts its kills
    summary = json.loads(path.read_text())
    assert summary["complete"] is False and summary["verdict"] == "leak"
    assert summary["memory_limit"]["source"] == "cgroup" and summary["memory_limit"]["bytes"] == LIMIT_MIB * MIB
    oom = summary["oom"]
    assert oom["imminent"] is True and oom["limit_bytes"] == LIMIT_MIB * MIB and oom["limit_source"] == "cgroup"
    assert oom["rss_bytes"] > 0.95 * LIMIT_MIB * MIB  # the default watermark
    # the watermark is judged on what the cgroup's limit counts: its charge (issue #41)
    assert oom["figure"] == summary["memory_limit"]["figure"] == "cgroup_bytes"
    assert oom["cgroup_bytes"] > 0.95 * LIMIT_MIB * MIB
    assert oom["growing"][0]["metric"] == "rss_bytes"
    where = f"heartbeat_loop.py:{line_of_kept()}"
    leaks = [f for f in summary["findings"] if (place(f) or "").endswith(where) and counts(f)]
    assert leaks and leaks[0]["cause"] == "python_objects" and leaks[0]["state"] == "leak", summary["findings"]
    assert any((site["location"] or "").endswith(where) for site in oom["sites"]), oom["sites"]


def line_of_kept() -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "# KEPT:" in text)
