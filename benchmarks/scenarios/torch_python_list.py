"""Every step's predictions copied to numpy and kept in a list "for later analysis" and never cleared: a
plain Python-level leak of 2 MiB a step."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _harness import Truth, marker
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor

START = 40
TRUTH = Truth(
    leak=True, cause="python_objects", framework="torch", steps=160, start=START,
    what="a local list of per-step numpy copies of the hidden activations", source="common user bug",
    location=(marker(__file__, "KEEP"),),
)


def run(h) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(1024, 64), torch.randn(1024, 1)) for _ in range(8)]
    kept = []
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for step in range(h.length):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad()
            hidden = model[1](model[0](x))
            F.mse_loss(model[2](hidden), y).backward()
            optimizer.step()
            if step >= START:
                kept.append(hidden.detach().numpy().copy())  # KEEP
            doctor.step()
            h.tick()
