"""Where a run really runs out of memory, so that projections aim at the level where it dies.

The process limit is the tightest of: physical memory; the memory limit of this process's own cgroup and
of its ancestors (v2 `memory.max`, v1 `memory.limit_in_bytes`, found through /proc/self/cgroup and the
cgroup mounts, so a limit set on a nested cgroup counts, not only the root's); and RLIMIT_AS / RLIMIT_DATA
where set. `memory_limit=` overrides them all. Device series (CUDA, MPS, JAX, MLX) carry their device's
total in their MetricSpec (the integrations read it); `describe` says which limit a metric was held to.

A limit is compared with the figure that enforces it (`Limit.figure`, the series projections, `on_limit`,
`oom_watermark` and the post-mortem read): a cgroup's charge (`cgroup_bytes`: v2 `memory.current`, v1
`memory.usage_in_bytes` of the cgroup whose limit it is, read by process.CgroupProbe) for a cgroup limit,
which counts page cache and kernel memory that resident memory leaves out and charges mapped files the
process did not fault in itself; the address space (`vms_bytes`, process.AddressSpaceProbe) for
RLIMIT_AS, which refuses a mapping, touched or not, once the virtual size would pass it; resident memory
(`rss_bytes`) for RAM and `memory_limit=`. The tightest limit is the one with the least room left on its
own figure.

RLIMIT_DATA bounds the private writable mappings, which no series reads: it is held as a resident size,
the rlimit less what its measure counts beyond the resident size when the limit is resolved (a leak
touches what it allocates, so it grows both alike).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psutil

from leakdoctor._base.metric import MetricSpec

__all__ = ["SOURCES", "RESIDENT", "CHARGE", "ADDRESS", "CHARGE_FILES", "UNLIMITED", "Limit", "process_limit", "describe",
           "ram", "cgroup_limit", "cgroup_mounts", "rlimits"]

SOURCES = ("cgroup", "rlimit", "RAM", "device", "user")
#: The figures a process limit is compared with: resident memory, a cgroup's charge, the address space.
RESIDENT, CHARGE, ADDRESS = "rss_bytes", "cgroup_bytes", "vms_bytes"
#: The file that holds a cgroup's charge, beside the file of its limit (v2, v1).
CHARGE_FILES = {"memory.max": "memory.current", "memory.limit_in_bytes": "memory.usage_in_bytes"}
#: At or above this, a cgroup v1 limit means "no limit" (v1 writes it as 2**63 - 1 rounded to a page).
UNLIMITED = 2**60


@dataclass(frozen=True)
class Limit:
    """A memory limit in bytes, where it comes from (one of SOURCES), the detail (a file, an rlimit), the
    series it is compared with (`figure`: resident memory; for a cgroup's limit the cgroup's charge where
    its file can be read; for RLIMIT_AS the address space) and, for a cgroup's, the file that holds its charge (beside the file its
    detail names). Two limits are the same limit whatever they are compared with."""

    bytes: float
    source: str
    detail: str = ""
    figure: str = field(default=RESIDENT, compare=False)
    charge: str | None = field(default=None, compare=False)

    def record(self) -> dict[str, Any]:
        """The summary's `memory_limit` entry."""
        return {"bytes": self.bytes, "source": self.source, "detail": self.detail, "figure": self.figure}


def process_limit(override: float | None = None, root: str | os.PathLike[str] = "/") -> Limit:
    """The limit of this process's memory: `override` if given, else the one of physical memory, the
    cgroup limit and the rlimits that leaves the least room on its own figure. `root` is where /proc and
    /sys are found."""
    if override is not None:
        return Limit(float(override), "user", "memory_limit=")
    usage = psutil.Process().memory_info()
    found = [limit for limit in (ram(), cgroup_limit(root), *rlimits()) if limit is not None]
    return min(found, key=lambda limit: limit.bytes - _used(limit, usage))


def _used(limit: Limit, usage: Any) -> float:
    """What `limit`'s figure reads now: the address space, a cgroup's charge, or resident memory."""
    if limit.figure == ADDRESS:
        return float(usage.vms)
    charge = _read_limit(Path(limit.charge)) if limit.figure == CHARGE and limit.charge else None
    return charge if charge is not None else float(usage.rss)


def describe(spec: MetricSpec | None, process: Limit, user: float | None) -> dict[str, Any] | None:
    """The `memory_limit` entry for a metric: the process limit for resident memory, the user's
    `memory_limit=` where a device series took it, else the device total in the metric's spec."""
    if spec is None or spec.name in (RESIDENT, process.figure):
        return process.record()
    if not spec.limit:
        return None
    if user is not None and spec.limit == user:
        return Limit(user, "user", f"memory_limit= for {spec.name}", spec.name).record()
    return Limit(spec.limit, "device", spec.where or spec.source, spec.name).record()


def ram() -> Limit:
    return Limit(float(psutil.virtual_memory().total), "RAM", "physical memory")


# --- cgroups ------------------------------------------------------------------------------------------

def cgroup_limit(root: str | os.PathLike[str] = "/") -> Limit | None:
    """The tightest memory limit on this process's cgroup and its ancestors, v2 and v1; None if none."""
    base = Path(root)
    try:
        membership = (base / "proc/self/cgroup").read_text()
    except OSError:
        return None
    mounts = cgroup_mounts(base)
    limits = []
    for line in membership.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            kind, name = "cgroup2", "memory.max"
        elif "memory" in controllers.split(","):
            kind, name = "memory", "memory.limit_in_bytes"
        else:
            continue
        for mount_root, mount_point in mounts.get(kind, []):
            for folder in _ancestors(base / mount_point.lstrip("/"), mount_root, path):
                value = _read_limit(folder / name)
                if value is not None:
                    limits.append(_cgroup(value, folder, name, base))
    return min(limits, key=lambda limit: limit.bytes) if limits else None


def _cgroup(value: float, folder: Path, name: str, base: Path) -> Limit:
    """A cgroup's limit, compared with the cgroup's charge where that file can be read (else with resident
    memory, as a limit of unknown charge)."""
    charge = folder / CHARGE_FILES[name]
    readable = _read_limit(charge) is not None
    return Limit(value, "cgroup", "/" + str((folder / name).relative_to(base)), CHARGE if readable else RESIDENT,
                 str(charge) if readable else None)


def cgroup_mounts(base: Path) -> dict[str, list[tuple[str, str]]]:
    """{"cgroup2": [(root, mount point)], "memory": [...]} from /proc/self/mountinfo; the usual places
    (/sys/fs/cgroup, /sys/fs/cgroup/memory) where it cannot be read."""
    try:
        lines = (base / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return {"cgroup2": [("/", "/sys/fs/cgroup")], "memory": [("/", "/sys/fs/cgroup/memory")]}
    mounts: dict[str, list[tuple[str, str]]] = {}
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 3:
            continue
        fstype, options = fields[dash + 1], fields[dash + 3].split(",")
        mount_root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            mounts.setdefault("cgroup2", []).append((mount_root, mount_point))
        elif fstype == "cgroup" and "memory" in options:
            mounts.setdefault("memory", []).append((mount_root, mount_point))
    return mounts


def _ancestors(mount: Path, mount_root: str, path: str) -> Iterator[Path]:
    """The folder of cgroup `path` under a mount of the hierarchy's `mount_root`, then each parent up to
    the mount. A path outside the mounted subtree (a container without a cgroup namespace sees the host's
    path) yields the mount itself: the container's own cgroup."""
    relative = os.path.relpath(path, mount_root) if mount_root != "/" else path.lstrip("/")
    parts = [] if relative.startswith("..") or relative in (".", "") else relative.split("/")
    for depth in range(len(parts), -1, -1):
        yield mount.joinpath(*parts[:depth])


def _read_limit(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= UNLIMITED:
        return None  # "max" (v2), or v1's "no limit"
    return float(text)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


# --- rlimits ------------------------------------------------------------------------------------------

def rlimits() -> list[Limit]:
    """RLIMIT_AS (compared with the address space) and RLIMIT_DATA (as a resident size: the rlimit less
    the data size beyond the resident size now, see the module docstring), where set (soft limits)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return []
    found = []
    soft = _soft(resource, "RLIMIT_AS")
    if soft is not None:
        found.append(Limit(float(soft), "rlimit", f"RLIMIT_AS {soft} bytes of address space", ADDRESS))
    soft = _soft(resource, "RLIMIT_DATA")
    usage = psutil.Process().memory_info()
    if soft is not None and getattr(usage, "data", None) is not None:
        gap = float(usage.data - usage.rss)
        found.append(Limit(float(soft) - gap, "rlimit",
                           f"RLIMIT_DATA {soft} bytes, less {gap:.0f} bytes of data size beyond the resident size"))
    return found


def _soft(resource: Any, name: str) -> int | None:
    """The soft limit `name` of the resource module, None where unset or unknown."""
    kind = getattr(resource, name, None)
    if kind is None:
        return None
    soft, _ = resource.getrlimit(kind)
    return None if soft == resource.RLIM_INFINITY else soft
