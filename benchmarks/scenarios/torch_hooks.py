"""A forward hook registered on every step and never removed (the developers' guide's seed case): the
module's hook table gains one hook per step, and every forward pass runs all of them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _harness import Truth, marker
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor

START = 40
TRUTH = Truth(
    leak=True, cause="hook_accumulation", framework="torch", remedy="remove_hooks", steps=160, remedy_steps=220,
    start=START,
    what="register_forward_hook called inside the loop", source="developers' guide seed",
    location=(marker(__file__, "HOOK-DEF"), marker(__file__, "HOOK-REGISTER")),
)


def record_norm(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:  # HOOK-DEF
    module.activation_norm = output.detach().norm()


def run(h) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(1024, 64), torch.randn(1024, 1)) for _ in range(8)]
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for step in range(h.length):
            if step >= START:
                model[0].register_forward_hook(record_norm)  # HOOK-REGISTER
            x, y = batches[step % len(batches)]
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            doctor.step()
            h.tick()
