"""The doctor for a step that leakdoctor is handed as a callable (the pytest plugin's test body or
`leak_check` step): the loop doctor of the frameworks this process imported, with the model and optimizer
the first call of the step showed, as `leakdoctor run` attaches at a framework's step (frameworks.py). So a
bug gets one cause, one holder and one line whichever entry point judged it (each loads the same
integrations): a list of outputs that keeps their autograd graphs is `retained_graph` at the list's line, a
hook added per step `hook_accumulation` at its line, not growth of native memory at the allocating line.

The doctor is torch's when torch is imported, else MLX's, else JAX's, else the engine; the integrations of
the other frameworks imported join it. The model is the one `leakdoctor run` finds (the module holding the
most of the first optimizer's parameters, frameworks.model_of) when the step stepped an optimizer, else
the outermost torch module it called."""

from __future__ import annotations

import sys
from typing import Any, Callable

from leakdoctor._runner.loaded import FRAMEWORKS, imported, integration_of

__all__ = ["FRAMEWORKS", "FirstStep", "imported", "integration_of", "make_doctor"]



class FirstStep:
    """One call of the step, watched: the torch modules it called and the torch optimizers it stepped
    (global hooks, removed when the call returns). Keeps them only until the doctor is made."""

    def __init__(self) -> None:
        self.modules: dict[int, Any] = {}
        self.optimizers: list[Any] = []

    def run(self, step: Callable[[], object]) -> None:
        handles = self._watch()
        try:
            step()
        finally:
            for handle in handles:
                handle.remove()

    def _watch(self) -> list[Any]:
        torch = sys.modules.get("torch")
        if torch is None:
            return []
        handles = []
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            handles.append(torch.nn.modules.module.register_module_forward_pre_hook(self._called))
            handles.append(register_optimizer_step_post_hook(self._stepped))
        except Exception:  # noqa: BLE001 - a torch without global hooks: no model found, the doctor still judges
            for handle in handles:
                handle.remove()
            return []
        return handles

    def _called(self, module: Any, args: Any) -> None:
        self.modules.setdefault(id(module), module)

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not any(o is optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)

    def targets(self) -> tuple[Any, Any]:
        """(model, optimizer) of the torch doctor: the first optimizer stepped and its model (as `leakdoctor
        run` finds it), else the outermost module called (the one with the most submodules); None for
        what the step did not show."""
        from leakdoctor._runner.frameworks import model_of

        optimizer = self.optimizers[0] if self.optimizers else None
        model = model_of(optimizer) if optimizer is not None else None
        if model is None and self.modules:
            model = max(self.modules.values(), key=lambda m: sum(1 for _ in m.modules()))
        return model, optimizer


def make_doctor(first: FirstStep, **options: Any) -> Any:
    """The loop doctor for this process's frameworks (see the module's docstring), with `options`."""
    frameworks = imported()
    extra = [integration_of(name) for name in frameworks[1:]]
    options["integrations"] = [*options.pop("integrations", ()), *extra]
    kind = frameworks[0] if frameworks else None
    if kind == "torch":
        from leakdoctor.callbacks.torch import LeakDoctor as TorchDoctor

        model, optimizer = first.targets()
        return TorchDoctor(model=model, optimizer=optimizer, **options)
    if kind == "mlx":
        from leakdoctor.callbacks.mlx import LeakDoctor as MlxDoctor

        return MlxDoctor(**options)
    if kind == "jax":
        from leakdoctor.callbacks.jax import LeakDoctor as JaxDoctor

        return JaxDoctor(**options)
    from leakdoctor.doctor import LeakDoctor

    return LeakDoctor(**options)
