"""A correct PyTorch loop that reports how it was run and exits with status 3 (tests/test_run.py runs it
with python and under `leakdoctor run`: the same output and status)."""

import sys

print("name", __name__, "argv", sys.argv, "path0", sys.path[0], "file", __file__)
print("imported before the script's own imports:", sorted(m for m in ("numpy", "psutil", "torch") if m in sys.modules))

import torch  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 16), torch.randn(64, 1)
losses = []
for _ in range(120):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print("losses", " ".join(f"{v:.6f}" for v in losses[::20]))
sys.exit(3)
