"""torchrun: a plain PyTorch DDP loop (tests/scripts/ddp_loop.py, gloo on CPU, two ranks of which only rank 1
leaks) launched by `python -m torch.distributed.run --nproc-per-node 2 --standalone`, with the torch
LeakDoctor in the script, and unedited under `leakdoctor run` (torchrun starting `-m leakdoctor run` on each
rank): one merged summary on rank 0 holding rank 1's finding, each rank's Prometheus server on its own port
(base + LOCAL_RANK). Per-rank post-mortems: rank 1 dies of MemoryError mid-loop, or is SIGKILLed as the
out-of-memory killer does, and leaves its own summary beside the configured one (leaks.rank1.json), which
rank 0 never received. What the runner itself writes follows the same rule: ranks on which no step was
seen each write their "unwatched" summary, rank 0 to the summary path, rank 1 beside it.

Each job runs in a session of its own and the whole group is killed at its deadline or at the end of the
test, so a hang fails the test rather than the suite."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from helpers import place
from procs import SCRIPTS, env

from leakdoctor._lifecycle.stopping import FARTHEST

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(150)

SCRIPT = SCRIPTS / "ddp_loop.py"
#: Seconds a two-rank job may take on a loaded 2-core machine (it takes about 8 unloaded).
DEADLINE = 75
#: The doctor's options for a short run: every step sampled, short windows (an investigation concludes
#: around step 31).
OPTIONS = {"warmup": 5, "window": 3, "overhead": 1.0, "verbose": False}
#: Rank 1's finding: its list attribute `hoard` (1 MiB kept a step), counted by the doctor.
CAUSE, METRIC = "container_growth", "len(Linear.hoard)"


def torchrun(*args: str | os.PathLike[str]) -> list[str]:
    """The command line of `torchrun --nproc-per-node 2 --standalone ARGS`."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", *map(str, args)]


def under_leakdoctor_run(folder: Path, *extra: str) -> list[str]:
    """torchrun starting `leakdoctor run` on each rank, with the script knowing nothing of leakdoctor."""
    options = [item for name, value in OPTIONS.items() for item in ("-o", f"{name}={value}")]
    return torchrun("-m", "leakdoctor", "run", "--summary", folder / "leaks.json", *options, *extra, SCRIPT, folder)


@contextlib.contextmanager
def job(command: list[str], folder: Path) -> Iterator[subprocess.Popen]:
    """`command` in a session of its own, its output in files of `folder`; at the end, whatever is left of
    its process group (torchrun and its ranks) is killed."""
    with open(folder / "out.txt", "w") as out, open(folder / "err.txt", "w") as err:
        process = subprocess.Popen(command, cwd=folder, env=env(), stdout=out, stderr=err, start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def run(command: list[str], folder: Path) -> int:
    """Run a job to its end (failing the test at the deadline); its exit status."""
    with job(command, folder) as process:
        try:
            return process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {DEADLINE} s (killed):\n{output(folder)}")


def output(folder: Path) -> str:
    return (folder / "out.txt").read_text() + (folder / "err.txt").read_text()[-4000:]


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def rank_ones(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["cause"] == CAUSE and f["metric"] == METRIC]


def assert_merged(folder: Path, steps: int = 120) -> dict:
    """Rank 0's merged summary: both ranks, rank 1's finding (cause, metric, place) gathered into it and
    not seen on rank 0, and each rank's file (rank 1's: the one its heartbeat wrote once it found the
    leak, completed at the end)."""
    summary = load(folder / "leaks.json")
    assert summary["rank"] == 0 and summary["complete"] and summary["verdict"] == "leak"
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["steps"] for r in ranks] == [steps, steps]
    assert ranks[0]["verdict"] == "clean" and ranks[1]["verdict"] == "leak"
    found = rank_ones(ranks[1]["findings"])
    assert found and found[0] in summary["findings"], ranks[1]["findings"]
    assert "hoard" in place(found[0]) and found[0]["state"] == "leak"
    assert not rank_ones(ranks[0]["findings"])
    assert [r["file"] for r in ranks] == [str(folder / "leaks.json"), str(folder / "leaks.rank1.json")]
    own = load(folder / "leaks.rank1.json")
    assert own["rank"] == 1 and own["complete"] and own["steps"] == steps and rank_ones(own["findings"])
    return summary


def test_torchrun_with_the_doctor_in_the_script_merges_every_rank_on_rank_0(tmp_path):
    assert run(torchrun(SCRIPT, tmp_path, "--doctor"), tmp_path) == 0, output(tmp_path)
    assert_merged(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("leaks*.json")) == ["leaks.json", "leaks.rank1.json"]


def free_base_port(ranks: int = 2) -> int:
    """A port P such that P .. P + ranks - 1 are free now."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + ranks - 1 > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + ranks):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no two free ports in a row")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_torchrun_under_leakdoctor_run_merges_every_rank_and_serves_each_on_its_port(tmp_path):
    base = free_base_port()
    # the final values stay served a minute after finish(): scraped then, and the job killed
    command = under_leakdoctor_run(tmp_path, "--prometheus-port", str(base), "-o", "prometheus_linger=60")
    with job(command, tmp_path) as process:
        deadline = time.monotonic() + DEADLINE
        while not (tmp_path / "leaks.json").exists() or not load(tmp_path / "leaks.json")["complete"]:
            assert process.poll() is None, output(tmp_path)
            assert time.monotonic() < deadline, f"no final summary after {DEADLINE} s:\n{output(tmp_path)}"
            time.sleep(0.2)
        summary = assert_merged(tmp_path)
        pages = {rank: scrape(base + rank) for rank in (0, 1)}  # base + LOCAL_RANK
    assert summary["framework"] == "torch" and summary["errors"] == [], summary["errors"]
    for rank, page in pages.items():
        verdicts = [line for line in page.splitlines() if line.startswith("leakdoctor_verdict{")]
        assert verdicts and all(f'rank="{rank}"' in line for line in verdicts), page[-2000:]


def test_a_rank_that_dies_of_memory_error_leaves_its_own_post_mortem(tmp_path):
    assert run(torchrun(SCRIPT, tmp_path, "--doctor", "--fail-at", "80"), tmp_path) != 0
    own = load(tmp_path / "leaks.rank1.json")
    assert own["rank"] == 1 and own["complete"] and own["steps"] == 79 and own["ranks"] == []
    assert own["oom"]["step"] == 79 and own["oom"]["error"].startswith("MemoryError")
    assert any(g["metric"] == "rss_bytes" for g in own["oom"]["growing"])
    assert rank_ones(own["findings"]) and own["verdict"] == "leak"
    # rank 0, left waiting in the next all_reduce, ended too and wrote its own summary, not rank 1's
    main = load(tmp_path / "leaks.json")
    assert main["rank"] == 0 and main["ranks"] == [] and not rank_ones(main["findings"])


def test_a_rank_sigkilled_leaves_its_own_summary_from_the_heartbeat(tmp_path):
    assert run(torchrun(SCRIPT, tmp_path, "--doctor", "--kill-at", "80"), tmp_path) != 0
    own = load(tmp_path / "leaks.rank1.json")  # written when its finding was made: the kill left it
    assert own["rank"] == 1 and not own["complete"] and own["steps"] < 80
    assert rank_ones(own["findings"])


def test_leakdoctor_run_on_limit_stop_under_torchrun_stops_every_rank_together_and_merges(tmp_path):
    # ~330 MiB resident at the start: rank 1's 1 MiB a step reaches 600 MiB in under 300 steps
    command = under_leakdoctor_run(tmp_path, "--on-limit", "stop", "-o", "memory_limit=600MiB")
    assert run(command + ["--steps", "1000"], tmp_path) == 1, output(tmp_path)  # the runner's stop: exit 1
    summary = load(tmp_path / "leaks.json")
    stopped, by, ranks = summary["stopped"], summary["stopped_by"], summary["ranks"]
    assert stopped["step"] == summary["steps"] < 1000
    assert by["rank"] == 1 and stopped["step"] - FARTHEST * OPTIONS["window"] < by["step"] <= stopped["step"]
    assert [r["steps"] for r in ranks] == [stopped["step"]] * 2 and rank_ones(ranks[1]["findings"])
    assert rank_ones(summary["findings"]) and ranks[1]["series"]["rss_bytes"]["peak"] < 600 * 2**20


def test_leakdoctor_run_under_torchrun_writes_an_unwatched_rank_s_summary_beside_rank_0_s(tmp_path):
    # a script that takes no step (nor imports torch: the cheapest launch): each rank's runner writes the summary
    script = tmp_path / "evaluate.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'], 'evaluated')\n")
    assert run(torchrun("-m", "leakdoctor", "run", "--summary", tmp_path / "leaks.json", script), tmp_path) == 0, \
        output(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("leaks*.json")) == ["leaks.json", "leaks.rank1.json"]
    main, own = load(tmp_path / "leaks.json"), load(tmp_path / "leaks.rank1.json")
    assert (main["rank"], own["rank"]) == (0, 1) and main["verdict"] == own["verdict"] == "unwatched"
    assert (tmp_path / "err.txt").read_text().count("took no step") == 1, output(tmp_path)  # printed on rank 0 only
