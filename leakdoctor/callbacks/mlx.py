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
from typing import TYPE_CHECKING, Any

from leakdoctor import doctor
from leakdoctor.framework import Framework
from leakdoctor.integrations import _mlx as mlx_integration
from leakdoctor.settings import DoctorOptions, documented, parse_bytes

if TYPE_CHECKING:
    from typing_extensions import Unpack


@documented
class LeakDoctor(doctor.LeakDoctor):
    """The MLX loop doctor: `leakdoctor.LeakDoctor` with MLX's probes (active and cache memory), forensics,
    rules and remedies (force_eval, cap_cache). Named `LeakDoctor` like the engine and the other loop
    doctors (one class name, a module per framework), so the import alone says the framework.

    Args:
        model: the `mlx.nn.Module` being trained, or None: the doctor then looks for it among the loop's
            local variables when it investigates.
        optimizer: its `mlx.optimizers.Optimizer`, or None (found the same way).
        **options: the shared options, below (README "Options").

    Raises:
        UnknownOptionError: an argument or option name it does not take, with the nearest valid one (a
            ValueError and a TypeError both).
        ValueError: a bad value, named with the valid ones.

    Example:
        >>> from leakdoctor.callbacks.mlx import LeakDoctor
        >>> with LeakDoctor(model=model, optimizer=optimizer, remedies="safe") as doctor:  # doctest: +SKIP
        ...     for x, y in batches:
        ...         loss, grads = loss_and_grad(model, x, y)
        ...         optimizer.update(model, grads)
        ...         doctor.step(loss=loss)
        >>> doctor.summary.verdict  # doctest: +SKIP
        'clean'
    """

    framework = "mlx"

    def __init__(self, *, model: Any = None, optimizer: Any = None, **options: Unpack[DoctorOptions]) -> None:
        mlx_integration.core()
        import mlx.nn as nn
        import mlx.optimizers as optim

        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f"model={reprlib.repr(model)}: expected an mlx.nn.Module or None")
        if optimizer is not None and not isinstance(optimizer, optim.Optimizer):
            raise ValueError(f"optimizer={reprlib.repr(optimizer)}: expected an mlx.optimizers.Optimizer or None")
        limit = options.get("memory_limit")
        integration = mlx_integration.integration(model, optimizer, parse_bytes(limit) if limit is not None else None)
        super().__init__(part=Framework(name=type(self).framework, integrations=[integration]), **options)


__all__ = ["LeakDoctor"]
