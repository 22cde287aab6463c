"""Benign growth by design: a Dataset that decodes each sample on first access and keeps the decoded
sample in memory (`self.cache[index] = ...`), so the first epoch (150 steps) grows memory by 160 KB a
step and every later epoch reads from memory: growth that stops at the end of the first epoch."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from _harness import Truth
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor

TRUTH = Truth(
    leak=False, cause=None, framework="torch", steps=300, start=0,
    what="a Dataset caching every decoded sample during the first epoch (150 steps of 32 samples)",
    source="in-memory dataset caching",
)


class DecodedCache(torch.utils.data.Dataset):
    def __init__(self, count: int) -> None:
        self.count = count
        self.cache: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index not in self.cache:
            rng = np.random.default_rng(index)  # "decoding": 5 KB of features per sample
            self.cache[index] = torch.from_numpy(rng.standard_normal(1280).astype(np.float32))
        sample = self.cache[index]
        return sample[:64], sample[64:65]


def run(h) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(DecodedCache(150 * 32), batch_size=32, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    step = 0
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        while step < h.length:
            for x, y in loader:
                optimizer.zero_grad()
                F.mse_loss(model(x.repeat(8, 1)), y.repeat(8, 1)).backward()
                optimizer.step()
                doctor.step()
                h.tick()
                step += 1
                if step == h.length:
                    break
