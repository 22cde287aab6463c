"""A plain PyTorch loop that registers a forward hook every step and never removes it (run by
tests/test_run.py under `leakdoctor run`, unedited)."""

import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randn(64, 1)
seen = []
for step in range(steps):
    model[1].register_forward_hook(lambda module, args, out: seen.append(1))  # HOOK: never removed
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
print(f"trained {steps} steps, loss {loss.item():.4f}")
