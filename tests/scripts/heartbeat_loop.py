"""A training loop whose summary is on disk while it runs, to be killed (tests/test_heartbeat.py,
tests/test_oom_kill.py). Usage: `heartbeat_loop.py MODE FOLDER [MIB STEPS [CGROUP]]`.

MODE leak: a LeakDoctor (a heartbeat of 0.5 s) over a step that keeps a record of MIB MiB every step
(the line marked KEPT) for STEPS steps at most: until it is killed, by the test or by the kernel.
MODE clean: a step that keeps nothing, for `leakdoctor run --step-on train_step`, until FOLDER/stop exists.
CGROUP: a cgroup folder this process moves itself into first (its cgroup.procs), so that the doctor
finds the cgroup's memory limit; it exits 3 if it is not in that cgroup afterwards."""

import os
import sys
import time
from pathlib import Path

mode, folder = sys.argv[1], Path(sys.argv[2])
mib, steps = (float(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (0.0, 0)
if len(sys.argv) > 5:
    cgroup = Path(sys.argv[5])
    (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
    if not any(line.split(":", 2)[2].strip().endswith(f"/{cgroup.name}") for line in open("/proc/self/cgroup")):
        sys.exit(3)  # not moved: no limit would stop the leak

kept = []
items = int(mib * 2**20) // 8


def train_step(i):
    if items:
        kept.append([float(i)] * items)  # KEPT: every step's record, forever
    time.sleep(0.002)
    return i


if mode == "leak":
    from leakdoctor import LeakDoctor

    doctor = LeakDoctor(summary_path=folder / "leaks.json", heartbeat=0.5, warmup=5, window=3, overhead=1.0)
    deadline = time.monotonic() + 120
    for i in range(steps):
        train_step(i)
        doctor.step()
        if time.monotonic() > deadline:
            break
    print(f"not killed after {len(kept)} steps", flush=True)
else:
    i = 0
    while not (folder / "stop").exists():
        train_step(i)
        i += 1
    print(f"stopped after {i} steps", flush=True)
