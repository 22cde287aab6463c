"""Benign warm-up growth that outlasts the doctor's warm-up: a batch-size warm-up (the batch grows from 64
to 2048 samples over the first 80 steps, a common schedule for large-batch training), so activation and
gradient memory grow step by step until the final batch size is reached, then hold."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _harness import Truth
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor

RAMP = 80
TRUTH = Truth(
    leak=False, cause=None, framework="torch", steps=240, start=0,
    what="batch size ramped from 64 to 2048 over the first 80 steps", source="batch-size warm-up",
)


def run(h) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data, target = torch.randn(2048, 64), torch.randn(2048, 1)
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for step in range(h.length):
            size = int(64 + (2048 - 64) * min(1.0, step / RAMP))
            optimizer.zero_grad()
            F.mse_loss(model(data[:size]), target[:size]).backward()
            optimizer.step()
            doctor.step()
            h.tick()
