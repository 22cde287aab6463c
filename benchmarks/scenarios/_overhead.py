"""What each tool costs on the same clean loop, as the corpus runs it: CPU time per step with the tool
over CPU time per step without it, in blocks run back to back in one process and alternating which goes
first (benchmarks/common.paired_ratio), so drift of a shared machine hits both sides of a pair alike.

    .venv/bin/python benchmarks/scenarios/_overhead.py /tmp/overhead.json

Loop: a PyTorch MLP (64-1024-1, batches of 512, SGD, one thread: a step of about 5 ms), blocks of BLOCK
steps. Tools as the corpus uses them: leakdoctor's LeakDoctor (defaults, after DOCTOR_WARMUP blocks), the per-step
RSS read that feeds the threshold and stormlog rules (stormlog's analysis itself runs after the run, on
the recorded series), tracemalloc tracing on, tracemalloc with a snapshot diff every CHECK steps,
objgraph.growth() every CHECK steps. Tracing starts with each tracemalloc block, as the corpus starts it
after the loop's first step: a process traced from its start (PYTHONTRACEMALLOC=1) also traces its
imports, and each of its snapshots costs more. Then Lightning: fits of FIT_STEPS steps of the same MLP
(batches of 256) with a CSV logger, without a callback, with LeakDoctorCallback and with
DeviceStatsMonitor(cpu_stats=True), timed from batch SKIP (the Trainer's start-up left out).

Blocks and pairs are few, so that the whole measurement takes well under a minute: ratios are good to a
few percent, enough to tell a tool that costs nothing from one that costs a multiple of the step.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any, Callable

import objgraph
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import paired_ratio  # noqa: E402

from leakdoctor.callbacks.torch import LeakDoctor  # noqa: E402
from leakdoctor.integrations._process import RssReader  # noqa: E402

BLOCK = 50
PAIRS = 5
#: objgraph costs several steps per look: its ratio stands far above the noise in fewer pairs.
OBJGRAPH_PAIRS = 2
#: Blocks the doctor steps through before the pairs: its warm-up (20 steps) and its first looks at the
#: allocator's early growth (an investigation of a few hundred ms each, at longer and longer intervals, which
#: a long run amortizes and a 50-step block cannot).
DOCTOR_WARMUP = 8
CHECK = 10
FIT_STEPS = 200
FIT_PAIRS = 3
SKIP = 50

AfterStep = Callable[[int], None]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1))


class Loop:
    """The clean torch loop; `block(after_step)` runs BLOCK steps and returns CPU seconds per step."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = mlp()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.batches = [(torch.randn(512, 64), torch.randn(512, 1)) for _ in range(8)]

    def block(self, after_step: AfterStep = lambda i: None) -> float:
        start = time.process_time()
        for i in range(BLOCK):
            x, y = self.batches[i % len(self.batches)]
            self.optimizer.zero_grad()
            F.mse_loss(self.model(x), y).backward()
            self.optimizer.step()
            after_step(i)
        return (time.process_time() - start) / BLOCK

    def traced(self, after_step: AfterStep = lambda i: None) -> float:
        """A block with tracemalloc tracing on (started for it, stopped after it)."""
        tracemalloc.start()
        try:
            return self.block(after_step)
        finally:
            tracemalloc.stop()


class Looks:
    """The looks a user takes every CHECK steps, as the corpus's objgraph and tracemalloc runs take them,
    each timed."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.snapshot: Any = None
        self.seconds: dict[str, list[float]] = {"objgraph": [], "tracemalloc": []}

    def objgraph(self, i: int) -> None:
        if i % CHECK == CHECK - 1:
            begin = time.perf_counter()
            objgraph.growth(limit=10, peak_stats=self.peaks)
            self.seconds["objgraph"].append(time.perf_counter() - begin)

    def tracemalloc(self, i: int) -> None:
        if i % CHECK == CHECK - 1:
            begin = time.perf_counter()
            snapshot = tracemalloc.take_snapshot()
            if self.snapshot is not None:
                snapshot.compare_to(self.snapshot, "lineno")
            self.snapshot = snapshot
            self.seconds["tracemalloc"].append(time.perf_counter() - begin)

    def per_look(self) -> dict[str, float]:
        return {tool: statistics.median(seconds) for tool, seconds in self.seconds.items() if seconds}


def rss_recorder() -> AfterStep:
    """A per-step RSS read into a list, as the harness records the series the threshold and stormlog read."""
    read = RssReader()
    recorded: list[float] = []

    def record(i: int) -> None:
        recorded.append(read())
        if len(recorded) > 4 * BLOCK:
            recorded.clear()

    return record


def row(loop: str, tool: str, base: Callable[[], float], run: Callable[[], float], pairs: int) -> dict[str, Any]:
    """The median ratio of `run` over `base` across `pairs` pairs, and the range of the pairs."""
    ratio, ratios = paired_ratio(base, run, pairs)
    return {"loop": loop, "tool": tool, "ratio": ratio, "low": min(ratios), "high": max(ratios)}


def loop_rows() -> tuple[list[dict[str, Any]], float]:
    """Each tool on the torch loop; and the loop's CPU seconds per step without a tool."""
    loop = Loop()
    for _ in range(3):
        loop.block()  # the first steps import and allocate what every later step reuses
    doctor = LeakDoctor(model=loop.model, optimizer=loop.optimizer, memory_limit="8GiB", verbose=False)
    for _ in range(DOCTOR_WARMUP):
        loop.block(lambda i: doctor.step())
    looks, record = Looks(), rss_recorder()
    tools = {
        "leakdoctor (defaults)": (lambda: loop.block(lambda i: doctor.step()), PAIRS),
        "RSS read per step (threshold, stormlog input)": (lambda: loop.block(record), PAIRS),
        "tracemalloc tracing on": (loop.traced, PAIRS),
        f"tracemalloc + snapshot diff every {CHECK} steps": (lambda: loop.traced(looks.tracemalloc), PAIRS),
        f"objgraph.growth() every {CHECK} steps": (lambda: loop.block(looks.objgraph), OBJGRAPH_PAIRS),
    }
    step = statistics.median(loop.block() for _ in range(3))
    rows = [row("torch MLP", name, loop.block, run, pairs) for name, (run, pairs) in tools.items()]
    rows[0]["note"] = doctor_note(doctor.finish().overhead)
    per_look = looks.per_look()
    for r, tool in ((rows[3], "tracemalloc"), (rows[4], "objgraph")):
        r["note"] = f"{per_look[tool] * 1e3:.1f} ms per look"
    return rows, step


def doctor_note(overhead: dict[str, Any]) -> str:
    """The doctor's own account of its cost over the whole measurement, warm-up blocks included."""
    return (f"its own account: {overhead['fraction_of_step_time']:.2%} of step time in probes; "
            f"{overhead['investigations']} investigation(s), {overhead['forensic_seconds']:.1f} s in all")


def lightning_rows() -> list[dict[str, Any]]:
    """LeakDoctorCallback and DeviceStatsMonitor against a plain fit, CPU time per step from batch SKIP."""
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import DeviceStatsMonitor
    from lightning.pytorch.loggers import CSVLogger

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(L.Callback):
        """CPU seconds per step from batch SKIP to the last."""

        def __init__(self) -> None:
            self.start = self.per_step = 0.0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == SKIP:
                self.start = time.process_time()
            elif batch_idx == FIT_STEPS - 1:
                self.per_step = (time.process_time() - self.start) / (FIT_STEPS - 1 - SKIP)

    x = torch.randn(FIT_STEPS * 256, 64)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=256)
    folder = tempfile.mkdtemp()

    def fit(extra: Callable[[], list[Any]]) -> Callable[[], float]:
        def run() -> float:
            clock = Clock()
            L.seed_everything(0, verbose=False)
            trainer = L.Trainer(max_steps=FIT_STEPS, log_every_n_steps=50, callbacks=[clock, *extra()],
                                logger=CSVLogger(folder, name="overhead"), accelerator="cpu", devices=1,
                                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
            trainer.fit(Regressor(), data)
            return clock.per_step
        return run

    tools = {"LeakDoctorCallback (defaults)": lambda: [LeakDoctorCallback(verbose=False, memory_limit="8GiB")],
             "DeviceStatsMonitor(cpu_stats=True)": lambda: [DeviceStatsMonitor(cpu_stats=True)]}
    return [row("Lightning fit", name, fit(lambda: []), fit(extra), FIT_PAIRS) for name, extra in tools.items()]


def main(out: str) -> None:
    torch.set_num_threads(1)
    rows, step = loop_rows()
    rows += lightning_rows()
    text = (f"The torch loop's step took {step * 1e3:.2f} ms of CPU without a tool; {PAIRS} pairs of {BLOCK}-step "
            f"blocks per tool ({OBJGRAPH_PAIRS} for objgraph), and {FIT_PAIRS} pairs of {FIT_STEPS}-step Lightning "
            f"fits. Before its pairs the doctor steps through {DOCTOR_WARMUP * BLOCK} steps: its warm-up and its "
            f"first investigations, which a long run amortizes. A ratio is CPU time per step with the tool over "
            f"without it (1.000: no cost). The looks of objgraph and tracemalloc cost what the note says each "
            f"time, whatever the step: at a look every {CHECK} steps of a {step * 1e3:.1f} ms step, that is the "
            f"ratio shown; a user looking once an epoch pays it once an epoch.")
    Path(out).write_text(json.dumps({"rows": rows, "step_seconds": step, "text": text}), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
