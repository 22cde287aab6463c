"""What one investigation costs, part by part (issue #36): a torch loop that keeps each step's output (with
its graph) in a global list, under the torch doctor at its defaults, in a process that also holds BALLAST
live Python records (a real script's data, vocabularies, caches), each size in a fresh process. Every
cleanup rung and forensic is timed through the doctor's guard (the one place that calls them), so the parts
add up to the investigation's time (the ladders' reads of every probe are the rest).

Run: .venv/bin/python benchmarks/run.py investigation     (writes the section)
     .venv/bin/python benchmarks/bench_investigation.py --once BALLAST   (one process, JSON on stdout)
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, table, write_section  # noqa: E402

BALLASTS = (0, 200_000)
STEPS = 300
RUNS = 2


def once(ballast: int) -> dict:
    import torch

    from leakdoctor._base import guard

    spent: dict[str, float] = collections.defaultdict(float)
    call = guard.Guard.call

    def timed(self, part, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return call(self, part, fn, *args, **kwargs)
        finally:
            if part.startswith(("cleanup ", "forensic ")):
                spent[part] += time.perf_counter() - start

    guard.Guard.call = timed
    from leakdoctor.callbacks.torch import LeakDoctor

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    records = [{"i": i, "v": [i] * 3} for i in range(ballast)]
    history = []
    with LeakDoctor(model=model, optimizer=optimizer, verbose=False) as doctor:
        for _ in range(STEPS):
            out = model(torch.randn(64, 256))
            loss = out.square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(out)
            doctor.step()
    overhead = doctor.summary.overhead
    return {"ballast": len(records), "investigations": overhead["investigations"],
            "forensic_seconds": overhead["forensic_seconds"], "parts": dict(spent),
            "causes": [f.cause for f in doctor.summary.findings]}


def main() -> None:
    if sys.argv[1:2] == ["--once"]:
        print(json.dumps(once(int(sys.argv[2]))))
        return
    began = time.monotonic()
    rows = []
    for ballast in BALLASTS:
        runs = [json.loads(subprocess.run([sys.executable, __file__, "--once", str(ballast)], check=True,
                                          capture_output=True, text=True).stdout.splitlines()[-1])
                for _ in range(RUNS)]
        for run in runs:
            investigations = max(1, run["investigations"])
            parts = sorted(run["parts"].items(), key=lambda kv: -kv[1])
            rows.append([f"{ballast:,}", run["investigations"], f"{run['forensic_seconds'] / investigations:.2f} s",
                         ", ".join(f"{name.split(' ', 1)[1]} {sec / investigations * 1e3:.0f} ms" for name, sec in parts),
                         " ".join(run["causes"])])
            print(rows[-1], flush=True)
    write_section("03_investigation", "\n".join([
        "## One investigation, part by part", "",
        f"A torch loop keeping each output with its graph in a global list ({STEPS} steps, the torch doctor at its "
        f"defaults), in a process holding N live Python records besides; {RUNS} fresh processes per size "
        f"(`.venv/bin/python benchmarks/run.py investigation`, {(time.monotonic() - began) / 60:.0f} min, "
        f"{machine()}). Per investigation: its time, and each cleanup rung and forensic as the guard timed it "
        "(the ladders' reads of every probe are the rest).", "",
        table(["records alive", "investigations", "per investigation", "parts (per investigation)", "found"], rows)]))


if __name__ == "__main__":
    main()
