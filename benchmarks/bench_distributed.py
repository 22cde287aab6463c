"""Ranks that stop together (issue #24): what the agreement costs, and how late the common stop comes.

Two gloo ranks on CPU run a DDP loop (a small linear model: DDP's gradient all_reduce keeps them in
lockstep) with the torch LeakDoctor at its defaults and on_limit="stop". Under torch.distributed the ranks
agree at steps every rank knows whether one asked to stop: one all_reduce of three integers, the first after
`window` (6) steps, each setting the steps to the next (what keeps the agreements within the doctor's
overhead share, between 1 and 8 windows).

- Cost: a clean run of STEPS steps with no limit in reach; the agreements' count and seconds are the
  summary's (`overhead.stop_agreements`, `stop_agreement_seconds`), per agreement and as a share of the
  run's wall time, beside a bare all_reduce of one integer timed in the same processes (its floor).
- Latency: rank 1 keeps 2 MiB a step under a limit 300 MiB above its resident memory; the steps between
  the step rank 1 asked (`stopped_by.step`) and the step both ranks stopped (`stopped.step`), which the
  schedule bounds by window - 1, and how far below the limit rank 1 stopped.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import machine, write_section  # noqa: E402
from helpers import report_to, run_ranks  # noqa: E402

MIB = 2**20
STEPS = 1200
RUNS = 3
LEAK_CHUNK = 2**18  # float64 items: 2 MiB a step
HEADROOM = 300 * MIB
TIMEOUT = 300


def rank_main(rank: int, port: int, folder: str, conn: Any, *, leak: bool) -> None:
    report_to(conn, run_rank, rank, port, folder, leak, label=f"rank {rank}")


def run_rank(rank: int, port: int, folder: str, leak: bool) -> dict[str, Any]:
    import psutil
    import torch
    import torch.distributed as dist

    from leakdoctor.callbacks.torch import LeakDoctor

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    floor = bare_all_reduce(torch, dist)
    net = torch.nn.Linear(64, 1)
    net.hoard = []
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    limit = psutil.Process().memory_info().rss + (HEADROOM if leak else 64 * 2**30)
    summary_path = os.path.join(folder, "leaks.json")
    start = time.perf_counter()
    with LeakDoctor(model=model, optimizer=optimizer, memory_limit=limit, on_limit="stop", verbose=False,
                    summary_path=summary_path) as doctor:
        for step in range(1, STEPS + 1):
            loss = model(torch.randn(32, 64)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if leak and rank == 1:
                net.hoard.append(torch.ones(LEAK_CHUNK, dtype=torch.float64))
            doctor.step()
            if doctor.should_stop:
                break
    wall = time.perf_counter() - start
    peak = psutil.Process().memory_info().rss
    dist.destroy_process_group()
    summary = json.loads(Path(summary_path).read_text()) if rank == 0 else None
    return {"rank": rank, "steps": step, "wall": wall, "floor": floor, "limit": limit, "rss": peak,
            "summary": summary}


def bare_all_reduce(torch: Any, dist: Any, n: int = 200) -> float:
    """The median time of one all_reduce (MAX) of three int64, as the agreement sends, with nothing else."""
    times = []
    for _ in range(n):
        flag = torch.zeros(3, dtype=torch.int64)
        start = time.perf_counter()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def two_ranks(leak: bool) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        return run_ranks(functools.partial(rank_main, leak=leak), folder, timeout=TIMEOUT)


def cost_row(run: int) -> str:
    ranks = two_ranks(leak=False)
    overhead = ranks[0]["summary"]["overhead"]
    count, seconds = overhead["stop_agreements"], overhead["stop_agreement_seconds"]
    per = seconds / count if count else float("nan")
    wall = ranks[0]["wall"]
    gap = ranks[0]["steps"] / count if count else float("nan")
    return (f"| {run} | {ranks[0]['steps']} | {wall / ranks[0]['steps'] * 1e3:.2f} ms | {count} | {gap:.0f} | "
            f"{per * 1e6:.0f} µs | {ranks[0]['floor'] * 1e6:.0f} µs | {seconds / wall:.2%} |")


def latency_row(run: int) -> str:
    ranks = two_ranks(leak=True)
    summary = ranks[0]["summary"]
    stopped, by = summary.get("stopped") or {}, summary.get("stopped_by") or {}
    stop, asked = stopped.get("step"), by.get("step")
    below = (ranks[1]["limit"] - ranks[1]["rss"]) / MIB
    same = "yes" if ranks[0]["steps"] == ranks[1]["steps"] else f"no ({ranks[0]['steps']}, {ranks[1]['steps']})"
    gap = stop - asked if stop is not None and asked is not None else "-"
    return f"| {run} | {by.get('rank', '-')} | {asked} | {stop} | {gap} | {same} | {below:.0f} MiB |"


def main() -> None:
    cost = [cost_row(i + 1) for i in range(RUNS)]
    latency = [latency_row(i + 1) for i in range(RUNS)]
    text = f"""## Distributed: ranks that stop together

`benchmarks/bench_distributed.py`, {machine()}. Two gloo ranks on CPU, a DDP loop of a small linear model,
the torch `LeakDoctor` at its defaults with `on_limit="stop"`: the ranks agree at steps every rank knows, one
all_reduce of three integers, the first after `window` (6) steps, each setting the steps to the next (what keeps
the agreements within the doctor's `overhead` share, 0.5%, between 1 and 8 windows). {RUNS} runs of each.

### What the agreement costs (a clean run, no limit in reach)

Per agreement: the summary's `stop_agreement_seconds / stop_agreements` on rank 0; the floor: a bare
all_reduce of three int64 in the same processes, before the loop (median of 200). Share: the agreements' time
over the loop's wall time.

| run | steps | step time | agreements | steps apart (mean) | per agreement | bare all_reduce | share of run |
| --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(cost)}

An agreement waits for the slower rank to reach it, so its time is mostly the ranks' skew at that step, not
the collective: on a busy machine it is larger than the bare all_reduce. Steps of 2 ms are far shorter than a
DDP step on GPUs; there the agreements come every window and cost a far smaller share.

### From the ask to the common stop (rank 1 keeps 2 MiB a step, limit 300 MiB above its start)

| run | asked by rank | asked at step | stopped at step | steps between | same step on both | rank 1 below its limit |
| --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(latency)}
"""
    write_section("distributed", text)
    print(text)


if __name__ == "__main__":
    main()
