"""A PyTorch MLP whose training step registers a forward hook (to look at activations) and never removes
it, a mistake the guides warn about: every step adds one more hook, each forward pass runs all of them,
and the step slows down as memory grows. leakdoctor names it hook_accumulation, points at the hook, and
with remedies="all" drops the repeats (remove_hooks), keeping the first."""

from __future__ import annotations

from typing import Any


def train(steps: int = 400, **doctor_args: Any):
    """Train for `steps` steps under leakdoctor's torch doctor; return its summary."""
    import torch

    from leakdoctor.callbacks.torch import LeakDoctor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(256, 128), torch.randint(0, 10, (256,))
    latest: dict[str, float] = {}
    with LeakDoctor(model=model, optimizer=optimizer, remedies="all", **doctor_args) as doctor:
        for _ in range(steps):
            model[1].register_forward_hook(lambda module, args, out: latest.update(mean=float(out.detach().mean())))  # never removed
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            doctor.step()
    return doctor.summary
