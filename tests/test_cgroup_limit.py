"""A cgroup's limit is compared with the cgroup's charge, not with resident memory (issue #41): a leaking
loop runs in a memory cgroup this test creates (v1 or v2, whichever the machine has, under this process's
own cgroup), writing page cache besides its leak (the charge counts it, resident memory does not), with
on_limit="stop" and oom_watermark: the stop comes within the margin of the step where the charge reaches
the limit, while resident memory is far below it; the post-mortem is written when the charge passes the
watermark; the summary names the figure. Skipped only where no memory cgroup can be made here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

from test_oom_kill import Cgroup

MIB = 2**20
#: What the loop leaks a step in resident memory, and writes a step to a file (page cache: charge only).
LEAK, CACHE = 1 * MIB, 3 * MIB
#: The cgroup's limit: python, numpy and leakdoctor (under 150 MiB charged), and room for the leak.
LIMIT = 600 * MIB


@pytest.fixture
def cgroup():
    """A memory cgroup of this test's own, limited to LIMIT (test_oom_kill.Cgroup: v2 or v1, under this
    process's own cgroup; skipped, with every reason, where none can be made). Removed at the end."""
    made = Cgroup.make(LIMIT)
    try:
        yield made
    finally:
        made.remove()


CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path

    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    (folder / "cgroup.procs").write_text(str(os.getpid()))  # into the cgroup before anything is allocated

    from leakdoctor import LeakDoctor
    from leakdoctor.integrations import _limits as limits

    LEAK, CACHE = int(sys.argv[3]), int(sys.argv[4])
    charge = folder / ("memory.current" if (folder / "memory.current").exists() else "memory.usage_in_bytes")
    limit = limits.process_limit()
    path = out / "leaks.json"
    kept, rows, stop, post_mortem = [], [], None, None
    with open(out / "cache.bin", "wb") as cache, LeakDoctor(
            summary_path=path, on_limit="stop", oom_watermark=0.8, heartbeat=None, warmup=5, window=3,
            overhead=1.0, sampler="inline", verbose=False) as doctor:
        for step in range(1, 2000):
            kept.append(bytearray(os.urandom(16)) * (LEAK // 16))  # the leak: resident, and charged
            cache.write(os.urandom(16) * (CACHE // 16))  # page cache: charged, not resident
            cache.flush()
            doctor.step()
            used = int(charge.read_text())
            rows.append((step, used, doctor.readings.get("rss_bytes")))
            if post_mortem is None and path.exists():
                post_mortem = json.loads(path.read_text()).get("oom")
            if stop is None and doctor.should_stop:
                stop = step  # the loop goes on, to see where the charge reaches the limit
            if used >= 0.97 * limit.bytes:
                break
    summary = doctor.finish()
    os.unlink(out / "cache.bin")
    print(json.dumps({"limit": limit.record(), "stop": stop, "rows": rows, "post_mortem": post_mortem,
                      "summary": summary.to_dict()}))
""")


def test_a_cgroup_limit_is_judged_on_the_cgroups_charge(cgroup, tmp_path):
    limit = LIMIT
    run = subprocess.run([sys.executable, "-c", CHILD, str(cgroup.folder), str(tmp_path), str(LEAK), str(CACHE)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    summary = result["summary"]
    assert result["limit"]["source"] == "cgroup" and result["limit"]["figure"] == "cgroup_bytes"
    assert summary["memory_limit"]["figure"] == "cgroup_bytes" and summary["memory_limit"]["bytes"] == limit
    assert "cgroup_bytes" in summary["series"]
    # the step where the charge reached the limit (the loop ends at 97% of it: page cache is then reclaimed)
    rows = result["rows"]
    reached, charge_then, _ = rows[-1]
    assert charge_then >= 0.97 * limit, rows[-5:]
    stop = result["stop"]
    assert stop is not None and summary["stopped"]["step"] == stop, summary.get("stopped")
    assert "cgroup_bytes" in summary["stopped"]["reason"]
    margin = max(math.ceil(summary["settings"]["limit_margin"] * stop), 2)
    assert stop <= reached <= stop + margin + 3, (stop, reached, margin)
    # resident memory was far from the limit: a stop judged on it would have come much later
    rss_at_stop = next(rss for step, _, rss in rows if step == stop)
    assert rss_at_stop < 0.6 * limit
    # the post-mortem: written when the charge passed the watermark, resident memory still far below it
    oom = result["post_mortem"]
    assert oom is not None and oom["imminent"] is True and oom["figure"] == "cgroup_bytes"
    assert oom["cgroup_bytes"] > 0.8 * limit and oom["rss_bytes"] < 0.6 * limit
    assert oom["limit_source"] == "cgroup" and oom["limit_bytes"] == limit
    assert any(f["metric"] == "rss_bytes" and f["state"] == "leak" for f in summary["findings"])
