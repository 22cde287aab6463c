"""Two planted PyTorch bugs, in one place, for the three entry points that must judge them alike
(tests/test_one_judgement.py): the torch callback (planted_loop.py with `--doctor`), `leakdoctor run` on
planted_loop.py, and the pytest plugin on a test whose body is the step. `graphs_step` keeps every
prediction with its autograd graph in a list on the model; `hooks_step` registers a forward hook every step."""

import torch

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.history = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        out = self(x)
        self.history.append(out)  # GRAPHS: every prediction kept, autograd graph and all
        return out


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randn(64, 1)


def train() -> None:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def graphs_step() -> None:
    train()
    model.predict(x)


def hooks_step() -> None:
    model.layers[1].register_forward_hook(lambda module, args, out: None)  # HOOKS: one more every step, never removed
    train()
