"""The plots of four real runs, for the README: a clean torch loop, a torch loop that leaks hooks (no
remedy), the same loop remedied (`leakdoctor demo --case torch-hooks`), and the MLX lazy graph remedied
(`leakdoctor demo --case mlx-lazy`). Each run goes in a fresh process, so one run's heap cannot shape the
next one's memory. Writes benchmarks/results/plot_{clean,leak,remedied,mlx}.png (and .json beside).

    .venv/bin/python benchmarks/plots.py [clean leak remedied mlx]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "results"
CASES = ("clean", "leak", "remedied", "mlx")


def torch_loop(steps: int, leak: bool, **doctor_args: Any) -> Any:
    """A small torch MLP; with `leak`, a forward hook registered every step and never removed."""
    import torch

    from leakdoctor.callbacks.torch import LeakDoctor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(256, 128), torch.randint(0, 10, (256,))
    with LeakDoctor(model=model, optimizer=optimizer, **doctor_args) as doctor:
        for _ in range(steps):
            if leak:
                model[1].register_forward_hook(lambda module, args, out: None)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            doctor.step()
    return doctor.summary


def run(case: str) -> None:
    """Run one case in this process and write its summary and plot."""
    paths = {"summary_path": OUT / f"plot_{case}.json", "plot_path": OUT / f"plot_{case}.png", "verbose": False}
    if case == "clean":
        summary = torch_loop(600, leak=False, **paths)
    elif case == "leak":
        summary = torch_loop(400, leak=True, **paths)
    elif case == "remedied":
        from leakdoctor.examples import torch_hooks

        summary = torch_hooks.train(**paths)
    elif case == "mlx":
        from leakdoctor.examples import mlx_lazy

        summary = mlx_lazy.train(**paths)
    else:
        raise SystemExit(f"unknown case {case!r}: choose from {CASES}")
    print(f"{case}: {summary.verdict}, {summary.steps} steps -> {paths['plot_path']}", flush=True)


def main(cases: list[str]) -> int:
    if len(cases) == 1:
        run(cases[0])
        return 0
    failed = [case for case in cases or CASES if subprocess.run([sys.executable, __file__, case]).returncode]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
