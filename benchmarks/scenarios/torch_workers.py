"""DataLoader workers that copy the dataset (pytorch#13246): the samples live in a Python list of
objects, and every read from a forked worker writes the object's reference count, so the page holding
it is copied into the worker. The workers' unique memory grows as they touch more of the list, until each
holds a copy of it (an epoch); the main process's resident memory does not move, so tools that watch only
this process cannot see it. The run is a third of an epoch of few-millisecond steps: a read of the
workers' USS (tens of ms) fits the doctor's 0.5% budget every few seconds only, so leakdoctor reads which
of the list's pages the workers copied from their pagemaps instead (a fraction of a millisecond)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _harness import Truth
from torch import nn

from leakdoctor.callbacks.torch import LeakDoctor

TRUTH = Truth(
    leak=True, cause="dataloader_workers", framework="torch", steps=300, start=0,
    what="a Dataset holding its samples in a Python list, read by 2 forked DataLoader workers",
    source="pytorch#13246", location=("RecordsDataset.records",),
)


class RecordsDataset(torch.utils.data.Dataset):
    """Samples kept as Python objects, about one page apart."""

    def __init__(self, count: int) -> None:
        self.records = [bytes(4000) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((64,), float(len(self.records[index]) % 7))
        return x, x[:1]


def run(h) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(RecordsDataset(30_000), batch_size=32, shuffle=True, num_workers=2,
                                         multiprocessing_context="fork", generator=torch.Generator().manual_seed(0))
    with h.doctor(LeakDoctor, model=model, optimizer=optimizer) as doctor:
        for step, (x, y) in enumerate(loader):
            if step == h.length:
                break
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            doctor.step()
            h.tick()
