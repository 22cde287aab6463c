"""A training loop under a doctor, to be stopped by SIGTERM (tests/test_sigterm.py). Usage:
`sigterm_loop.py MODE FOLDER` with MODE plain (a LeakDoctor, plus one built in a function that returned
without finishing it), torch (the torch loop doctor), chain (the script's own SIGTERM handler, installed
first, ends the loop) or ignore (SIGTERM ignored before the doctor starts). Prints "ready" once the
loop has run a while; writes FOLDER/leaks.json (and FOLDER/orphan.json in plain mode)."""

import signal
import sys
import time
from pathlib import Path

from leakdoctor import LeakDoctor

mode, folder = sys.argv[1], Path(sys.argv[2])
stop = []
if mode == "chain":
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def orphan() -> None:
    LeakDoctor(summary_path=folder / "orphan.json", verbose=False)  # never finished, no reference kept


if mode == "torch":
    import torch

    from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    doctor = TorchDoctor(model=model, optimizer=optimizer, summary_path=folder / "leaks.json", overhead=1.0)

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
else:
    doctor = LeakDoctor(summary_path=folder / "leaks.json", overhead=1.0)
    if mode == "plain":
        orphan()

    def step() -> None:
        time.sleep(0.001)

deadline = time.monotonic() + (3 if mode == "ignore" else 60)
steps = 0
while not stop and time.monotonic() < deadline:
    step()
    doctor.step()
    steps += 1
    if steps == 80:  # past warm-up and the 50 steps a leak needs to be found: the run is watched
        print("ready", flush=True)
print(f"loop ended after {steps} steps", flush=True)
doctor.finish()
