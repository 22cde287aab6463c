"""Benign: the CUDA caching allocator's plateau, simulated on CPU. Each step stages a batch of a random
size (32 to 2048 rows) in a buffer from a pool that, like PyTorch's CUDA caching allocator, rounds
requests up to a size class (64 rows here) and keeps every freed block for reuse: the pool's reserved
memory grows each time a size class is first needed, less and less often, up to 66 MB when every class
has been seen, while the memory in use varies from step to step."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from _harness import Truth
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor

TRUTH = Truth(
    leak=False, cause=None, framework="torch", steps=200, start=0,
    what="a caching pool of staging buffers in 32 size classes, growing until every class is cached",
    source="PyTorch CUDA caching allocator FAQ",
)


class CachingPool:
    """Blocks rounded up to multiples of 64 rows; a freed block goes back to its class's free list,
    never to the system."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.free: dict[int, list[torch.Tensor]] = {}

    def take(self, rows: int) -> torch.Tensor:
        size = -(-rows // 64) * 64
        blocks = self.free.setdefault(size, [])
        return blocks.pop() if blocks else torch.empty(size, self.width)

    def give(self, block: torch.Tensor) -> None:
        self.free[len(block)].append(block)

    @property
    def reserved(self) -> int:
        return sum(b.nelement() * b.element_size() for blocks in self.free.values() for b in blocks)


def run(h) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    pool = CachingPool(512)
    data, target = torch.randn(2048, 512), torch.randn(2048, 1)
    sizes = np.random.default_rng(0).integers(32, 2049, size=h.length)
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for rows in sizes:
            rows = int(rows)
            block = pool.take(rows)
            batch = block[:rows].copy_(data[:rows])
            optimizer.zero_grad()
            F.mse_loss(model(batch), target[:rows]).backward()
            optimizer.step()
            del batch
            pool.give(block)
            doctor.step()
            h.tick()
    return {"pool_reserved_mib": round(pool.reserved / 2**20, 1), "classes": len(pool.free)}
