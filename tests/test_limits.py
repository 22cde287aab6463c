"""Where a run really runs out of memory (leakdoctor/integrations/_limits.py): cgroup v2 and v1 limits read from real
files laid out under a root folder as /proc and /sys are (this process's own cgroup, its ancestors, a
container that sees the host's path, hybrid hierarchies); RLIMIT_AS and RLIMIT_DATA read in a fresh
process that really set them; physical memory; the user's override; and which limit a summary says it
used."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from leakdoctor import LeakDoctor
from leakdoctor.integrations import MetricSpec
from leakdoctor.integrations import _limits as limits

MIB = 2**20
GIB = 2**30
V1_NO_LIMIT = "9223372036854771712"


def lay_out(root: Path, files: dict[str, str]) -> Path:
    """Write `files` ({path under root: text}) as real files under `root`."""
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def mountinfo(*mounts: tuple[str, str, str, str]) -> str:
    """mountinfo lines for (mount root, mount point, fstype, super options)."""
    return "".join(f"{30 + i} 23 0:{28 + i} {root} {point} rw,relatime - {fstype} {fstype} {options}\n"
                   for i, (root, point, fstype, options) in enumerate(mounts))


# --- cgroup v2 -------------------------------------------------------------------------------------------

def test_cgroup_v2_limit_of_this_process_own_nested_cgroup(tmp_path):
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "0::/user.slice/job-7/worker\n",
        "/proc/self/mountinfo": mountinfo(("/", "/sys/fs/cgroup", "cgroup2", "rw,nsdelegate")),
        "/sys/fs/cgroup/user.slice/memory.max": "max\n",
        "/sys/fs/cgroup/user.slice/job-7/memory.max": f"{3 * GIB}\n",
        "/sys/fs/cgroup/user.slice/job-7/worker/memory.max": "max\n",
    })
    limit = limits.cgroup_limit(root)
    assert limit == limits.Limit(3 * GIB, "cgroup", "/sys/fs/cgroup/user.slice/job-7/memory.max")


def test_cgroup_v2_takes_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path):
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "0::/a/b\n",
        "/proc/self/mountinfo": mountinfo(("/", "/sys/fs/cgroup", "cgroup2", "rw")),
        "/sys/fs/cgroup/a/memory.max": f"{GIB}\n",
        "/sys/fs/cgroup/a/b/memory.max": f"{4 * GIB}\n",
    })
    assert limits.cgroup_limit(root).bytes == GIB


def test_cgroup_v2_without_any_limit_is_none(tmp_path):
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "0::/a\n",
        "/proc/self/mountinfo": mountinfo(("/", "/sys/fs/cgroup", "cgroup2", "rw")),
        "/sys/fs/cgroup/a/memory.max": "max\n",
    })
    assert limits.cgroup_limit(root) is None


def test_a_container_that_sees_the_host_path_reads_its_own_cgroup_at_the_mount(tmp_path):
    # no cgroup namespace: /proc/self/cgroup names the host's path, the mount shows the container's cgroup
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "0::/system.slice/docker-abc.scope\n",
        "/proc/self/mountinfo": mountinfo(("/system.slice/docker-abc.scope", "/sys/fs/cgroup", "cgroup2", "rw")),
        "/sys/fs/cgroup/memory.max": f"{2 * GIB}\n",
    })
    assert limits.cgroup_limit(root) == limits.Limit(2 * GIB, "cgroup", "/sys/fs/cgroup/memory.max")


# --- cgroup v1 -------------------------------------------------------------------------------------------

def test_cgroup_v1_limit_of_this_process_memory_cgroup_beside_an_empty_v2(tmp_path):
    # a hybrid host, as on this project's machines: controllers on v1, an empty unified hierarchy
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "9:name=systemd:/\n5:cpu,cpuacct:/jobs\n4:memory:/process_api/7a08\n0::/\n",
        "/proc/self/mountinfo": mountinfo(("/", "/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
                                          ("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
                                          ("/", "/sys/fs/cgroup/unified", "cgroup2", "rw")),
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NO_LIMIT,
        "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": V1_NO_LIMIT,
        "/sys/fs/cgroup/memory/process_api/7a08/memory.limit_in_bytes": f"{1536 * MIB}\n",
        "/sys/fs/cgroup/cpu,cpuacct/jobs/memory.limit_in_bytes": "1024\n",  # not the memory controller
    })
    limit = limits.cgroup_limit(root)
    assert limit == limits.Limit(1536 * MIB, "cgroup", "/sys/fs/cgroup/memory/process_api/7a08/memory.limit_in_bytes")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cgroup_limit_is_compared_with_the_charge_of_the_cgroup_whose_limit_it_is(tmp_path, version):
    # the tightest limit is the parent's: its charge (which counts the siblings too) is what it bounds
    limit_file, charge_file = ("memory.max", "memory.current") if version == "v2" else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    mount, line, kind = ("/sys/fs/cgroup", "0::/job/worker\n", "cgroup2") if version == "v2" else \
        ("/sys/fs/cgroup/memory", "4:memory:/job/worker\n", "cgroup")
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": line,
        "/proc/self/mountinfo": mountinfo(("/", mount, kind, "rw,memory")),
        f"{mount}/job/{limit_file}": f"{GIB}\n",
        f"{mount}/job/{charge_file}": f"{300 * MIB}\n",
        f"{mount}/job/worker/{limit_file}": V1_NO_LIMIT if version == "v1" else "max\n",
        f"{mount}/job/worker/{charge_file}": f"{200 * MIB}\n",
    })
    limit = limits.cgroup_limit(root)
    assert limit.bytes == GIB and limit.figure == "cgroup_bytes"
    assert limit.charge == str(root / mount.lstrip("/") / "job" / charge_file)
    assert limit.record()["figure"] == "cgroup_bytes"
    (root / mount.lstrip("/") / "job" / charge_file).unlink()  # a charge that cannot be read: resident memory
    assert limits.cgroup_limit(root).figure == "rss_bytes"


def test_cgroup_v1_no_limit_value_means_none(tmp_path):
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "4:memory:/a\n",
        "/proc/self/mountinfo": mountinfo(("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory")),
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NO_LIMIT,
        "/sys/fs/cgroup/memory/a/memory.limit_in_bytes": V1_NO_LIMIT,
    })
    assert limits.cgroup_limit(root) is None


def test_without_mountinfo_the_usual_mount_points_are_read(tmp_path):
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "4:memory:/a\n",
        "/sys/fs/cgroup/memory/a/memory.limit_in_bytes": f"{GIB}\n",
    })
    assert limits.cgroup_limit(root).bytes == GIB


def test_no_cgroup_files_leave_physical_memory(tmp_path):
    assert limits.cgroup_limit(tmp_path) is None
    limit = limits.process_limit(root=tmp_path)
    if limit.source == "RAM":  # unless this machine's own rlimits are tighter
        assert limit.bytes == psutil.virtual_memory().total


def test_process_limit_takes_the_tightest_source(tmp_path):
    root = lay_out(tmp_path, {
        "/proc/self/cgroup": "0::/job\n",
        "/proc/self/mountinfo": mountinfo(("/", "/sys/fs/cgroup", "cgroup2", "rw")),
        "/sys/fs/cgroup/job/memory.max": f"{256 * MIB}\n",
    })
    assert limits.process_limit(root=root) == limits.Limit(256 * MIB, "cgroup", "/sys/fs/cgroup/job/memory.max")
    assert limits.process_limit(GIB, root=root) == limits.Limit(GIB, "user", "memory_limit=")  # the override wins


# --- rlimits, set for real in a fresh process -------------------------------------------------------------

RLIMIT_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import psutil
    from leakdoctor import LeakDoctor
    from leakdoctor.integrations import _limits as limits

    kind, headroom = sys.argv[1], int(sys.argv[2])
    usage = psutil.Process().memory_info()
    used = usage.vms if kind == "RLIMIT_AS" else usage.data
    resource.setrlimit(getattr(resource, kind), (used + headroom, resource.RLIM_INFINITY))
    found = [l for l in limits.rlimits() if l.detail.startswith(kind)]
    doctor = LeakDoctor(verbose=False)
    for _ in range(5):
        doctor.step()
    print(json.dumps({"limit": found[0].bytes, "detail": found[0].detail, "rss": usage.rss,
                      "summary": doctor.finish().memory_limit, "soft": used + headroom}))
""")


def rlimit_run(kind: str, headroom: int) -> dict:
    """RLIMIT_SCRIPT run in a fresh process with `kind` set `headroom` bytes above what it measures now."""
    import json

    run = subprocess.run([sys.executable, "-c", RLIMIT_SCRIPT, kind, str(headroom)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(run.stdout)


def test_rlimit_data_set_in_a_process_is_its_limit_as_a_resident_size():
    headroom = 400 * MIB
    result = rlimit_run("RLIMIT_DATA", headroom)
    assert result["detail"].startswith(f"RLIMIT_DATA {result['soft']} bytes")
    # the headroom the rlimit leaves is the headroom of the resident size (within what settled meanwhile)
    assert abs((result["limit"] - result["rss"]) - headroom) < 16 * MIB
    assert result["summary"]["source"] == "rlimit" and result["summary"]["bytes"] <= result["limit"] + 16 * MIB
    assert result["summary"]["figure"] == "rss_bytes"


def test_rlimit_as_set_in_a_process_is_compared_with_the_address_space():
    result = rlimit_run("RLIMIT_AS", 400 * MIB)
    assert result["detail"].startswith(f"RLIMIT_AS {result['soft']} bytes")
    assert result["limit"] == result["soft"]  # the rlimit itself, on the figure it bounds
    assert result["summary"] == {"bytes": result["soft"], "source": "rlimit", "detail": result["detail"],
                                 "figure": "vms_bytes"}


#: A loop under RLIMIT_AS that, after the doctor is made, reserves address space it never touches (as
#: allocators and frameworks do), then leaks LEAK resident bytes a step, with on_limit="stop".
RESERVED_SCRIPT = textwrap.dedent("""
    import json, mmap, os, resource, sys
    import psutil
    from leakdoctor import LeakDoctor

    MIB = 2**20
    headroom, reserve, leak = (int(a) * MIB for a in sys.argv[1:4])
    process = psutil.Process()
    resource.setrlimit(resource.RLIMIT_AS, (process.memory_info().vms + headroom, resource.RLIM_INFINITY))
    kept, rows, stop, raised = [], [], None, None
    doctor = LeakDoctor(on_limit="stop", warmup=5, window=3, overhead=1.0, sampler="inline", heartbeat=None,
                        verbose=False)
    reserved = mmap.mmap(-1, reserve)  # address space, never touched: no resident memory
    try:
        for step in range(1, 5000):
            kept.append(bytearray(os.urandom(16)) * (leak // 16))
            doctor.step()
            usage = process.memory_info()
            rows.append((step, usage.vms, usage.rss))
            if stop is None and doctor.should_stop:
                stop = step  # the loop goes on, to see where the address space runs out
    except MemoryError:
        raised = len(kept)
    summary = doctor.finish()
    print(json.dumps({"stop": stop, "raised": raised, "rows": rows, "summary": summary.to_dict()}))
""")


def test_address_space_reserved_after_the_start_counts_against_rlimit_as():
    """The stop is judged on the address space RLIMIT_AS bounds: a reservation made after the limit was
    resolved leaves resident memory far below the limit when the mapping fails."""
    import json
    import math

    run = subprocess.run([sys.executable, "-c", RESERVED_SCRIPT, "700", "300", "4"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    summary = result["summary"]
    assert summary["memory_limit"]["figure"] == "vms_bytes" and "vms_bytes" in summary["series"]
    assert result["raised"] is not None  # the loop went on until the address space ran out
    stop = result["stop"]
    assert stop is not None and summary["stopped"]["step"] == stop, summary.get("stopped")
    margin = max(math.ceil(summary["settings"]["limit_margin"] * stop), 2)
    assert stop <= result["raised"] <= stop + margin + 3, (stop, result["raised"], margin)
    rss_at_stop = next(rss for step, _, rss in result["rows"] if step == stop)
    assert rss_at_stop < summary["memory_limit"]["bytes"] - 250 * MIB  # resident memory was far from it


# --- which limit a summary used ------------------------------------------------------------------------------

def test_the_summary_says_the_user_limit_it_used():
    doctor = LeakDoctor(memory_limit="1.5GiB", verbose=False)
    for _ in range(5):
        doctor.step()
    summary = doctor.finish()
    assert summary.memory_limit == {"bytes": 1.5 * GIB, "source": "user", "detail": "memory_limit=",
                                    "figure": "rss_bytes"}
    assert summary.to_dict()["memory_limit"]["source"] == "user"


def test_a_device_series_is_held_to_its_device_total():
    process = limits.Limit(8 * GIB, "cgroup", "/sys/fs/cgroup/memory.max")
    cuda = MetricSpec("cuda_allocated_bytes", "bytes", limit=80 * GIB, source="cuda", where="cuda:0")
    assert limits.describe(cuda, process, None) == {"bytes": 80 * GIB, "source": "device", "detail": "cuda:0",
                                                    "figure": "cuda_allocated_bytes"}
    mlx = MetricSpec("mlx_active_bytes", "bytes", limit=4 * GIB, source="mlx")
    assert limits.describe(mlx, process, 4 * GIB)["source"] == "user"  # memory_limit= given to MLX's series
    assert limits.describe(MetricSpec("rss_bytes", "bytes", limit=8 * GIB), process, None) == process.record()
    assert limits.describe(MetricSpec("jax_live_bytes_cpu", "bytes"), process, None) is None  # no limit on CPU
