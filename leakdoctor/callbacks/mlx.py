"""The MLX loop doctor: `LeakDoctor(model=..., optimizer=...)` for hand-written MLX training loops.

    from leakdoctor.callbacks.mlx import LeakDoctor

    with LeakDoctor(model=model, optimizer=optimizer, remedies="safe", summary_path="leaks.json") as doctor:
        for x, y in batches:
            loss, grads = loss_and_grad(model, x, y)
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state)
            total = total + loss
            doctor.step(total=total)      # arrays you keep across steps: force_eval may evaluate them
    print(doctor.summary.verdict)

Keyword arguments of `step()` are this step's outputs. Pass the arrays you accumulate across steps
(`total=total`, `metrics=metrics`): if one turns out to chain a lazy graph, remedies="safe" evaluates it
with the model and optimizer state after every step (force_eval). The doctor itself never evaluates
anything unless a remedy is applied.
"""

from __future__ import annotations

import reprlib
from typing import Any

from leakdoctor import doctor
from leakdoctor.integrations import mlx as mlx_integration
from leakdoctor.settings import parse_bytes


class LeakDoctor(doctor.LeakDoctor):
    """leakdoctor.LeakDoctor with MLX's probes, forensics, rules and remedies. `model` (an mlx.nn.Module)
    and `optimizer` (an mlx.optimizers.Optimizer) are optional: without them the doctor looks for them
    among the loop's local variables when it investigates. Other keyword arguments: see
    leakdoctor.LeakDoctor."""

    framework = "mlx"

    def __init__(self, *, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        mlx_integration.core()
        import mlx.nn as nn
        import mlx.optimizers as optim

        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f"model={reprlib.repr(model)}: expected an mlx.nn.Module or None")
        if optimizer is not None and not isinstance(optimizer, optim.Optimizer):
            raise ValueError(f"optimizer={reprlib.repr(optimizer)}: expected an mlx.optimizers.Optimizer or None")
        limit = kwargs.get("memory_limit")
        part = mlx_integration.integration(model, optimizer, parse_bytes(limit) if limit is not None else None)
        super().__init__(integrations=[part, *kwargs.pop("integrations", ())], **kwargs)


__all__ = ["LeakDoctor"]
