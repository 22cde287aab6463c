"""Never the doctor's fault, round 3 (issue #27): a distributed job that never finished its doctors ends;
a slow or hanging gauge cannot stop training; a doctor made in a forked child writes its summary; under
`leakdoctor run`, forked children are watched and the parent writes the one summary; unfinished doctors
that are dropped give their descriptor and memory back; os._exit under `leakdoctor run` writes a summary;
a gauge of bytes that grows is a finding.

Scripts run in their own process group with a generous timeout, and the whole group is killed on timeout,
so that a hang fails the test instead of the suite."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import isolated, mentions, phrase, says
from procs import env, leakdoctor_run

from leakdoctor import LeakDoctor

#: Seconds a script may take on a loaded 2-core machine before it counts as hung.
HUNG = 240


def run_script(command: list, cwd: Path, timeout: float = HUNG) -> subprocess.CompletedProcess:
    """Run `command` in a session of its own; on timeout kill the whole group (the children too) and fail."""
    process = subprocess.Popen([str(c) for c in command], cwd=cwd, env=env(), text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{command} still running after {timeout} s (killed):\n{out}\n{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def write(folder: Path, name: str, code: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(code))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- a distributed job whose doctors nobody finished ends ----------------------------------------------------

DDP_NEVER_FINISHED = """
import multiprocessing
import sys

import torch
import torch.distributed as dist

from leakdoctor.callbacks.torch import LeakDoctor

DOCTORS = []   # held until interpreter exit, never finished by the script


def rank(rank, port, folder):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.Linear(8, 8)
    DOCTORS.append(LeakDoctor(model=model, summary_path=f"{folder}/leaks.json", verbose=False))
    for _ in range(60):
        model(torch.randn(4, 8)).sum().backward()
        DOCTORS[-1].step()


if __name__ == "__main__":
    port, folder = int(sys.argv[1]), sys.argv[2]
    other = multiprocessing.get_context("spawn").Process(target=rank, args=(1, port, folder))
    other.start()
    rank(0, port, folder)   # rank 0 in this process ...
    other.join()            # ... waits for rank 1 to exit, which (before) waited in a collective at its exit
    print("joined", other.exitcode)
"""


def test_a_two_rank_job_that_never_finished_its_doctors_ends(tmp_path):
    """Two gloo ranks, each with a torch LeakDoctor the script never finishes; rank 0 joins rank 1 at the
    end. Before, rank 1's exit-time finish entered a collective that rank 0 (waiting in join) never
    reached: the job ran forever. Now a doctor finished at exit gathers nothing, and says so."""
    pytest.importorskip("torch")
    script = write(tmp_path, "ddp.py", DDP_NEVER_FINISHED)
    result = run_script([sys.executable, script, free_port(), tmp_path], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "joined 0" in result.stdout
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["rank"] == 0 and summary["steps"] == 60 and summary["ranks"] == []
    notes = summary["notes"]
    assert says(notes, "never_finished", "not_gathered"), notes


# --- gauges under a time budget ------------------------------------------------------------------------------

def loop_with_gauges(steps: int) -> dict:
    """A loop with a gauge that hangs, one that takes 2 s (over the 1 s timeout), one that takes 0.2 s, one
    that hangs from its fourth call on (after three quick ones) for 5 s, and a quick one."""
    import threading
    import time

    calls = {"slow": 0, "late": 0}

    def slow() -> float:
        calls["slow"] += 1
        time.sleep(0.2)
        return 1.0

    def late() -> float:
        calls["late"] += 1
        if calls["late"] > 3:
            time.sleep(5)
        return 2.0

    never = threading.Event()
    doctor = LeakDoctor(verbose=False)
    doctor.watch("hangs", lambda: never.wait() and 0.0)
    doctor.watch("two_seconds", lambda: time.sleep(2) or 1.0)
    doctor.watch("slow", slow)
    doctor.watch("late", late, timeout=3.0)
    doctor.watch("quick", lambda: 3.0)
    for _ in range(steps):
        time.sleep(0.002)
        doctor.step()
    summary = doctor.finish()
    return {"steps": summary.steps, "errors": summary.errors, "series": sorted(summary.series),
            "slow_calls": calls["slow"], "late_calls": calls["late"], "quick": summary.series["quick"].end}


def test_a_hanging_gauge_is_switched_off_and_the_loop_finishes():
    result = isolated(loop_with_gauges, 200, timeout=HUNG)
    assert result["steps"] == 200
    errors = {e["part"]: e["error"] for e in result["errors"]}
    assert set(errors) == {"gauge 'hangs'", "gauge 'two_seconds'", "gauge 'late'"}, errors
    assert "did not return within its timeout of 1 s" in errors["gauge 'hangs'"]
    assert "timeout of 1 s" in errors["gauge 'two_seconds'"]
    assert "timeout of 3 s" in errors["gauge 'late'"]
    assert result["slow_calls"] <= 2, result  # paced by its cost: 0.2 s a call is read ~ once in 10,000 samples
    assert result["late_calls"] == 4, result
    assert result["quick"] == 3.0 and "slow" in result["series"], result


def test_a_gauge_timeout_must_be_seconds():
    doctor = LeakDoctor(verbose=False)
    for bad in (0, -1, float("inf"), "1s", True):
        with pytest.raises(ValueError, match="timeout="):
            doctor.watch("g", lambda: 1.0, timeout=bad)
    doctor.finish()


# --- a gauge of bytes that grows is a leak ---------------------------------------------------------------------

def test_a_byte_gauge_growing_a_megabyte_a_step_is_a_finding():
    held = [0.0]
    doctor = LeakDoctor(verbose=False, overhead=1.0)
    doctor.watch("cache_bytes", lambda: held[0], unit="bytes")
    for _ in range(300):
        held[0] += 1e6
        doctor.step()
    summary = doctor.finish()
    assert summary.verdict == "leak", summary.text()
    assert [(f.cause, f.metric, f.state) for f in summary.findings] == [("container_growth", "cache_bytes", "leak")]
    assert summary.findings[0].rate_per_step == pytest.approx(1e6, rel=0.05)
    assert not any(says(n, "not_a_leak") and mentions(n, "cache_bytes") for n in summary.notes), summary.notes


# --- doctors made in forked children --------------------------------------------------------------------------

DATALOADER_WORKERS = """
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from leakdoctor import LeakDoctor

DOCTOR = None


def start(worker):
    global DOCTOR
    DOCTOR = LeakDoctor(verbose=False, summary_path=os.path.join(sys.argv[2], f"worker{worker}.json"))


class Data(Dataset):
    def __len__(self):
        return 240

    def __getitem__(self, i):
        DOCTOR.step()
        return torch.zeros(4)


if __name__ == "__main__":
    loader = DataLoader(Data(), batch_size=4, num_workers=2, worker_init_fn=start, multiprocessing_context=sys.argv[1])
    print(sum(1 for _ in loader), "batches")
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_doctor_in_a_dataloader_worker_writes_its_summary(tmp_path, context):
    """A worker ends by os._exit (fork: no atexit); its doctor writes its summary all the same."""
    pytest.importorskip("torch")
    script = write(tmp_path, "workers.py", DATALOADER_WORKERS)
    result = run_script([sys.executable, script, context, tmp_path], tmp_path)
    assert result.returncode == 0 and "60 batches" in result.stdout, result.stderr
    steps = [json.loads((tmp_path / f"worker{w}.json").read_text())["steps"] for w in (0, 1)]
    assert sum(steps) == 240, steps


FORKED_PROCESS = """
import multiprocessing
import os
import sys

from leakdoctor import LeakDoctor


def child(path):
    doctor = LeakDoctor(verbose=False, summary_path=path)   # never finished: the process ends by os._exit
    for _ in range(30):
        doctor.step()
    globals()["kept"] = doctor


if __name__ == "__main__":
    folder = sys.argv[1]
    parent = LeakDoctor(verbose=False, summary_path=os.path.join(folder, "parent.json"))
    for _ in range(10):
        parent.step()
    process = multiprocessing.get_context("fork").Process(target=child, args=(os.path.join(folder, "child.json"),))
    process.start()
    process.join()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)   # a plain forked child that exits through atexit: the parent's doctor is not its own
    os.waitpid(pid, 0)
    print("parent file after the children:", os.path.exists(os.path.join(folder, "parent.json")))
"""


def test_a_forked_child_writes_its_own_doctor_and_leaves_the_parents(tmp_path):
    script = write(tmp_path, "forked.py", FORKED_PROCESS)
    result = run_script([sys.executable, script, tmp_path], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "parent file after the children: False" in result.stdout  # no child wrote the parent's summary
    assert json.loads((tmp_path / "child.json").read_text())["steps"] == 30
    assert json.loads((tmp_path / "parent.json").read_text())["steps"] == 10  # the parent's own exit wrote it


# --- leakdoctor run: a fork Pool, os._exit ---------------------------------------------------------------------

POOL = """
import multiprocessing

import torch

KEPT = []


def train(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(300):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        KEPT.append(bytearray(100_000))   # a leak: 100 kB a step, kept
    return round(loss.item(), 3)


if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(pool.map(train, [1, 2]))
"""


def test_leakdoctor_run_on_a_fork_pool_fails_on_the_childrens_leak_and_writes_one_summary(tmp_path):
    """The steps run in the Pool's workers: each worker's doctor reports to the parent, which writes the one
    summary (before: the parent said "no step", exited 0 despite --fail-on-leak, and a worker's SIGTERM
    handler sometimes wrote the file)."""
    pytest.importorskip("torch")
    script = write(tmp_path, "pool.py", POOL)
    out = tmp_path / "out"
    out.mkdir()
    result = run_script(leakdoctor_run("--fail-on-leak", "--summary", out / "leaks.json", script), tmp_path)
    assert result.returncode == 1, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["leaks.json"]
    summary = json.loads((out / "leaks.json").read_text())
    assert summary["verdict"] == "leak" and summary["steps"] == 300, summary
    assert says(summary["notes"], "forked_children"), summary["notes"]
    # printed once, by the parent
    assert len(phrase("verdict", verdict="LEAK").findall(result.stderr)) == 1, result.stderr
    assert not says(result.stderr, "no_step"), result.stderr


def test_leakdoctor_run_on_a_spawn_pool_says_the_steps_ran_in_spawned_children(tmp_path):
    """The steps run in a spawn Pool's workers, which leakdoctor run does not watch: the run is unwatched,
    and the summary says that the steps ran in spawned processes (with their count), not that --step-on
    would find them (the script's process has none)."""
    pytest.importorskip("torch")
    script = write(tmp_path, "pool.py", POOL.replace('get_context("fork")', 'get_context("spawn")'))
    out = tmp_path / "out"
    out.mkdir()
    result = run_script(leakdoctor_run("--fail-on-leak=major", "--summary", out / "leaks.json", script), tmp_path)
    assert result.returncode == 0, result.stderr  # the script's status: an unwatched run is no leak
    summary = json.loads((out / "leaks.json").read_text())
    assert summary["verdict"] == "unwatched" and summary["steps"] == 0, summary
    assert summary["unwatched"]["spawned"] == {"spawn": 2}, summary["unwatched"]
    assert "--step-on" not in summary["unwatched"]["fix"], summary["unwatched"]


OS_EXIT = """
import os

import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(80):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
os._exit(3)
"""


def test_os_exit_under_leakdoctor_run_writes_the_summary(tmp_path):
    pytest.importorskip("torch")
    script = write(tmp_path, "exits.py", OS_EXIT)
    result = run_script(leakdoctor_run("--fail-on-leak", "--summary", tmp_path / "leaks.json", script), tmp_path)
    assert result.returncode == 3, result.stderr  # the script's status
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["steps"] == 80 and summary["framework"] == "torch"


# --- unfinished doctors that are dropped --------------------------------------------------------------------

def dropped_doctors(count: int, folder: str) -> dict:
    """`count` doctors stepped and dropped without finish(): collected at once (nothing registered holds
    them), each writing its summary then and closing its descriptor."""
    import gc
    import weakref

    import psutil

    process = psutil.Process()
    warm = LeakDoctor(verbose=False)
    warm.step()
    del warm
    gc.collect()
    before = process.num_fds()
    alive = []
    for i in range(count):
        doctor = LeakDoctor(verbose=False, summary_path=Path(folder) / f"d{i % 3}.json")
        doctor.step()
        doctor.step()
        alive.append(weakref.ref(doctor))
        del doctor
    gc.collect()
    summary = json.loads((Path(folder) / "d0.json").read_text())
    return {"before": before, "after": process.num_fds(), "alive": sum(r() is not None for r in alive),
            "steps": summary["steps"], "notes": summary["notes"]}


def test_a_thousand_dropped_unfinished_doctors_leave_the_descriptor_count_flat(tmp_path):
    result = isolated(dropped_doctors, 1000, str(tmp_path), timeout=HUNG)
    assert result["after"] == result["before"], result
    assert result["alive"] == 0, result
    assert result["steps"] == 2
    assert says(result["notes"], "collected"), result["notes"]


def test_a_dropped_doctor_writes_its_summary_when_collected(tmp_path):
    path = tmp_path / "leaks.json"

    def train() -> None:
        doctor = LeakDoctor(verbose=False, summary_path=path)
        for _ in range(5):
            doctor.step()

    train()
    import gc

    gc.collect()
    assert json.loads(path.read_text())["steps"] == 5


DEFERRED_SIGTERM = """
import os
import signal
import sys
import time

from leakdoctor import LeakDoctor
from leakdoctor._lifecycle import termination

doctor = LeakDoctor(verbose=False, summary_path=sys.argv[1])
for _ in range(10):
    doctor.step()
with termination.finishing():   # as a doctor's finish() does while it writes its summary
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print("the write went on", flush=True)
print("not reached", flush=True)
"""


def test_a_sigterm_during_a_finish_waits_for_the_summary(tmp_path):
    """A Pool worker that finishes its doctor as it ends, terminated by its parent at that moment, was
    killed in the middle of the write (the summary of 2 runs in 6): the signal now waits for the write,
    then finishes the other doctors and ends the process by SIGTERM."""
    script = write(tmp_path, "deferred.py", DEFERRED_SIGTERM)
    result = run_script([sys.executable, script, tmp_path / "leaks.json"], tmp_path)
    assert result.returncode == -signal.SIGTERM, (result.returncode, result.stderr)
    assert result.stdout.splitlines() == ["the write went on"]
    assert json.loads((tmp_path / "leaks.json").read_text())["steps"] == 10
