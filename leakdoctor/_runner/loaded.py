"""The frameworks this process imported, and the integration of each that joins the doctor of another (a torch
loop that also jits with JAX): what the pytest plugin's doctor (in_process.py) and `leakdoctor run`'s
(frameworks.py) both load, so that a bug gets one answer."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["FRAMEWORKS", "imported", "integration_of"]

#: (framework, the module whose presence says the process uses it), in the order that picks the doctor.
FRAMEWORKS = (("torch", "torch"), ("mlx", "mlx.core"), ("jax", "jax"))


def imported() -> list[str]:
    """The frameworks this process imported, in FRAMEWORKS' order."""
    return [name for name, module in FRAMEWORKS if module in sys.modules]


def integration_of(name: str) -> Any:
    """The integration of a framework imported beside the doctor's own (no model or optimizer of its own)."""
    if name == "torch":
        from leakdoctor.integrations import _torch as part
    elif name == "mlx":
        from leakdoctor.integrations import _mlx as part  # type: ignore[no-redef]
    else:
        from leakdoctor.integrations import _jax as part  # type: ignore[no-redef]
    return part.integration()
