"""Two leaks in one loop are two findings, each at its own line with its own rate (issue #41): a list of
validation losses kept with their autograd graphs beside a global list that gains 100 kB of bytes a step
(before, the kept graphs explained resident memory and the bigger list went unreported); a forward hook
registered every step beside a function that jax.jit compiles again every step (the torch doctor with the
JAX integration added). Each reproduced in a fresh process (tests/helpers.isolated)."""

from __future__ import annotations

import inspect

import pytest
from helpers import counts, isolated, place

from leakdoctor.integrations._python import code_location

#: What the loop below appends every step besides its losses: 100 kB a step, the bigger leak.
BLOBS: list[bytes] = []


def graphs_and_bytes(steps: int) -> dict:
    """A training loop that keeps each validation loss with its graph (a forward pass of half the batch
    outside no_grad, some 40 kB of saved activations a step) and appends 100 kB of bytes to a global list."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from leakdoctor.callbacks.torch import LeakDoctor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    history = []
    # a fixed limit: whether tens of kB a step matter does not depend on this machine's memory
    with LeakDoctor(model=model, optimizer=optimizer, overhead=1.0, memory_limit="4GiB", verbose=False) as doctor:
        for _ in range(steps):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            history.append(F.mse_loss(model(x[:16]), y[:16]))  # kept with its graph: the first leak
            BLOBS.append(bytes(100_000))  # the second leak, the bigger one
            doctor.step()
    return doctor.finish().to_dict()


def line_of(fn, marker: str) -> int:
    """The line of `fn`'s source that holds `marker`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


def test_a_retained_graph_and_a_list_of_bytes_are_two_findings():
    summary = isolated(graphs_and_bytes, 600)
    leaks = [f for f in summary["findings"] if counts(f)]
    by_cause = {f["cause"]: f for f in leaks}
    assert summary["verdict"] == "leak"
    assert "retained_graph" in by_cause, summary["findings"]
    graph = by_cause["retained_graph"]
    assert place(graph).endswith(f"(tests/test_two_leaks.py:{line_of(graphs_and_bytes, 'first leak')})")
    blobs = [f for f in leaks if f is not graph and f["metric"] == "rss_bytes"]
    assert len(blobs) == 1, summary["findings"]
    assert blobs[0]["cause"] in ("python_objects", "container_growth")
    assert place(blobs[0]).endswith(f"tests/test_two_leaks.py:{line_of(graphs_and_bytes, 'second leak')}")
    # each its own rate, not resident memory's: together no more than it, the list of bytes the bigger
    rss = summary["series"]["rss_bytes"]["slope_per_step"]
    assert 0 < graph["rate_per_step"] < blobs[0]["rate_per_step"]
    assert graph["rate_per_step"] + blobs[0]["rate_per_step"] <= 1.01 * rss


def hooks_and_compiles(steps: int) -> dict:
    """A training loop that registers a forward hook every step and compiles a new lambda with jax.jit
    every step: the torch doctor, with the JAX integration added, watches both."""
    import jax
    import jax.numpy as jnp
    import torch
    import torch.nn.functional as F
    from torch import nn

    from leakdoctor.callbacks.torch import LeakDoctor
    from leakdoctor.integrations import _jax as jax_integration

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y, offsets = torch.randn(8, 16), torch.randn(8, 1), jnp.ones(4)
    with LeakDoctor(model=model, optimizer=optimizer, overhead=1.0, verbose=False,
                    integrations=[jax_integration.integration()]) as doctor:
        for step in range(steps):
            model[0].register_forward_hook(record)  # a hook a step: the first leak
            jax.jit(lambda v: v + step)(offsets).block_until_ready()  # a compile a step: the second leak
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            doctor.step()
    return doctor.finish().to_dict()


def record(module, inputs, output) -> None:
    """The forward hook the loop above registers again every step."""


def test_a_hook_a_step_and_a_compile_a_step_are_two_findings():
    pytest.importorskip("jax")
    summary = isolated(hooks_and_compiles, 120)
    leaks = {f["cause"]: f for f in summary["findings"] if counts(f)}
    assert summary["verdict"] == "leak"
    assert {"hook_accumulation", "compile_cache"} <= set(leaks), summary["findings"]
    hooks, compiles = leaks["hook_accumulation"], leaks["compile_cache"]
    assert place(hooks) == code_location(record)
    assert place(compiles) == f"tests/test_two_leaks.py:{line_of(hooks_and_compiles, 'second leak')}"
    assert hooks["metric"] != compiles["metric"]
    assert hooks["rate_per_step"] == pytest.approx(1.0, rel=0.2)
    assert compiles["rate_per_step"] == pytest.approx(1.0, rel=0.2)
