"""A running total of a loss tensor, `total_loss += loss` (PyTorch FAQ, "accumulating history across
your training loop"), here of an evaluation loss computed with grad enabled: each step's graph, with the
activations it saved, is chained to the previous one's, so none is ever freed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _harness import Truth, marker
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor

START = 40
TRUTH = Truth(
    leak=True, cause="retained_graph", framework="torch", remedy="detach_retained", steps=160,
    remedy_steps=220, start=START,
    what="total_loss += loss, the loss of a forward pass run with grad enabled", source="PyTorch FAQ",
    location=(marker(__file__, "TOTAL"),),
)


def run(h) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(1024, 64), torch.randn(1024, 1)) for _ in range(8)]
    x_val, y_val = torch.randn(1024, 64), torch.randn(1024, 1)
    total_loss = torch.zeros(())
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for step in range(h.length):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            if step >= START:
                total_loss += F.mse_loss(model(x_val), y_val)  # TOTAL
            doctor.step()
            h.tick()
    return {"total_loss": float(total_loss)}
