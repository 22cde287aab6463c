"""on_limit="stop" under torch.distributed: every rank stops together, at the same step. Two real ranks on
CPU, of which only rank 1 leaks (2 MiB a step, kept), with a real limit a few hundred MiB above its
resident memory: rank 1 asks to stop, the ranks agree (an all_reduce in a plain loop, the strategy's
reduce_boolean_decision under Lightning DDP), and both leave the loop at the same step, before the limit,
with one checkpoint; rank 0's summary says which rank asked, at which step and why (`stopped_by`).

The plain loop runs two gloo ranks spawned from this test; the Lightning fit runs this file as a script
(Lightning's subprocess launcher starts it again as rank 1). Each has a deadline, after which every
process it started is killed."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
from helpers import report_to, run_ranks

from leakdoctor._lifecycle.stopping import FARTHEST

MIB = 2**20
HEADROOM = 300 * MIB
CHUNK = 2**18  # float64 items: 2 MiB a step
WINDOW = 6  # the default window: the ranks agree first after WINDOW steps, then every WINDOW to FARTHEST windows
TIMEOUT = 240  # seconds, for the whole job: then every process is killed
ROOT = Path(__file__).resolve().parent.parent


def rss() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss)


def assert_ranks_stopped_together(summary: dict, stop_step: int, limit: float) -> None:
    """Rank 0's merged summary: stopped at `stop_step` (an agreement step), before rank 1's limit, and
    rank 1 asked, at most the longest gap between agreements earlier, with a reason; rank 1's finding is
    in it."""
    stopped, by = summary["stopped"], summary["stopped_by"]
    assert summary["rank"] == 0 and summary["verdict"] == "leak"
    assert stopped["step"] == stop_step == summary["steps"]
    assert by["rank"] == 1 and stop_step - FARTHEST * WINDOW < by["step"] <= stop_step
    assert isinstance(by["reason"], str) and by["reason"] and stopped["reason"] == by["reason"]
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["steps"] for r in ranks] == [stop_step, stop_step]
    assert ranks[1]["verdict"] == "leak" and ranks[1]["series"]["rss_bytes"]["peak"] < limit
    assert summary["projected_limit_step"] > stop_step
    # rank 1's finding, on the list that keeps the leak: gathered into rank 0's summary, not seen on rank 0
    hoards = [f for f in ranks[1]["findings"] if f["metric"].startswith("len(") and "hoard" in f["metric"]]
    assert hoards and hoards[0] in summary["findings"], ranks[1]["findings"]
    assert hoards[0]["metric"] not in {f["metric"] for f in ranks[0]["findings"]}, ranks[0]["findings"]


# --- a plain torch loop: two gloo ranks -----------------------------------------------------------------------

def leaky_ddp_loop(rank: int, folder: str, wrap: Callable[[Any], Any], steps: int,
                   save: Callable[[Any], str] | None = None) -> tuple[int, Any, float]:
    """The DDP loop of a linear model (`wrap` makes the DDP model of it: DistributedDataParallel, or Ray
    Train's prepare_model, tests/test_ray.py) in which rank 1 keeps 2 MiB a step on the model's list
    `hoard`, with the torch LeakDoctor (on_limit="stop" at a limit HEADROOM above the resident memory at
    the start, summary FOLDER/leaks.json, `save(model)` its checkpoint=) until it stops or `steps`.
    (last step, the doctor, the limit)."""
    import torch

    from leakdoctor.callbacks.torch import LeakDoctor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Linear(32, 1)
    net.hoard = []  # a list attribute of the model, which the doctor counts
    model = wrap(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    limit = rss() + HEADROOM
    step = 0
    with LeakDoctor(model=model, optimizer=optimizer, memory_limit=limit, on_limit="stop", overhead=1.0,
                    checkpoint=None if save is None else lambda: save(model), verbose=False,
                    summary_path=os.path.join(folder, "leaks.json")) as doctor:
        for step in range(1, steps + 1):
            loss = model(torch.randn(16, 32)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()  # DDP's gradient all_reduce: the ranks step in lockstep
            optimizer.step()
            if rank == 1:
                net.hoard.append(torch.ones(CHUNK, dtype=torch.float64))  # the leak, on rank 1 only
            doctor.step()
            if doctor.should_stop:
                break
    return step, doctor, limit


def loop_rank(rank: int, port: int, folder: str, conn: Any) -> None:
    """One of two gloo ranks of the DDP loop (run_ranks' target); rank 1 keeps 2 MiB a step. Sends back its
    stop step, its saves and (rank 0) the merged summary."""
    report_to(conn, _loop_rank, rank, port, folder, label=f"rank {rank}")


def _loop_rank(rank: int, port: int, folder: str) -> dict:
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    saves = []

    def save(model: Any) -> str:
        path = os.path.join(folder, f"model.rank{rank}.pt")
        torch.save(model.module.state_dict(), path)
        saves.append(path)
        return path

    try:
        step, doctor, limit = leaky_ddp_loop(rank, folder, torch.nn.parallel.DistributedDataParallel, 2000, save)
    finally:
        dist.destroy_process_group()
    summary = json.loads(Path(folder, "leaks.json").read_text()) if rank == 0 else None
    return {"rank": rank, "last_step": step, "should_stop": doctor.should_stop, "saves": saves, "limit": limit,
            "summary": summary}


def test_two_gloo_ranks_stop_together_when_one_leaks(tmp_path):
    ranks = run_ranks(loop_rank, str(tmp_path))
    steps = [r["last_step"] for r in ranks]
    assert steps[0] == steps[1] < 2000 and all(r["should_stop"] for r in ranks), steps
    # one checkpoint: rank 0's, where the summary says
    assert len(ranks[0]["saves"]) == 1 and ranks[1]["saves"] == []
    summary = ranks[0]["summary"]
    assert summary["stopped"]["checkpoint"] == ranks[0]["saves"][0]
    assert_ranks_stopped_together(summary, steps[0], ranks[1]["limit"])
    # the agreements: at least a window apart, at most FARTHEST windows; their time in the doctor's
    # overhead and its total
    overhead = summary["overhead"]
    assert steps[0] // (FARTHEST * WINDOW) <= overhead["stop_agreements"] <= steps[0] // WINDOW
    assert 0 < overhead["stop_agreement_seconds"] <= overhead["total_seconds"]
    # rank 1's own summary beside rank 0's: written when it found the leak, completed at the end
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaks.json", "leaks.rank1.json", "model.rank0.pt"]
    assert [r["file"] for r in summary["ranks"]] == [str(tmp_path / "leaks.json"), str(tmp_path / "leaks.rank1.json")]


# --- Lightning DDP: strategy="ddp" on CPU, this file as the script of both ranks ---------------------------

def lightning_main(folder: str) -> None:
    """One rank of a two-rank DDP fit (Lightning starts this file again as rank 1); rank 1 keeps 2 MiB a
    step. Each rank writes what it saw: its last global step, should_stop, its limit, and whether its
    `checkpoint=` was called."""
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import lightning.pytorch as L
    import torch
    import torch.nn.functional as F

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    torch.set_num_threads(1)

    class RankHoarder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(32, 1)
            self.hoard = []

        def training_step(self, batch, batch_idx):
            if self.global_rank == 1:
                self.hoard.append(np.ones(CHUNK))  # the leak, on rank 1 only
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    calls = []
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(2 * 16 * 3000, 32), torch.randn(2 * 16 * 3000, 1))
    limit = rss() + HEADROOM
    doctor = LeakDoctorCallback(on_limit="stop", memory_limit=limit, overhead=1.0, verbose=False,
                                checkpoint=lambda: calls.append("called"), summary_path=Path(folder) / "leaks.json")
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=3000, logger=False,
                        callbacks=[doctor], default_root_dir=folder, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(RankHoarder(), torch.utils.data.DataLoader(data, batch_size=16))
    rank = trainer.global_rank
    Path(folder, f"rank{rank}.json").write_text(json.dumps(
        {"global_step": trainer.global_step, "should_stop": trainer.should_stop, "limit": limit,
         "checkpoint_calls": len(calls)}))


def test_two_lightning_ddp_ranks_stop_together_when_one_leaks(tmp_path):
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    job = subprocess.Popen([sys.executable, "tests/test_distributed_stop.py", str(tmp_path)], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = job.communicate(timeout=TIMEOUT)
    finally:  # rank 1 is rank 0's child: whatever is left of the job's session goes
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait(10)
    assert job.returncode == 0, err[-4000:]
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    steps = [s["global_step"] for s in seen]
    assert steps[0] == steps[1] < 3000 and all(s["should_stop"] for s in seen), seen
    assert [s["checkpoint_calls"] for s in seen] == [1, 0]  # checkpoint= on rank 0 alone
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["framework"] == "lightning"
    assert_ranks_stopped_together(summary, steps[0], seen[1]["limit"])
    # one checkpoint file, saved by every rank together (rank 0 writes it); it is the one the summary names
    saved = sorted((tmp_path / "checkpoints").iterdir())
    assert [str(p) for p in saved] == [summary["stopped"]["checkpoint"]]
    assert steps[0] // (FARTHEST * WINDOW) <= summary["overhead"]["stop_agreements"] <= steps[0] // WINDOW


if __name__ == "__main__":
    lightning_main(sys.argv[1])
