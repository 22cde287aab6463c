"""MLX on real training loops (mlx[cpu]), each in a fresh process: a loop that never evaluates its state
(lazy_graph, remedied by force_eval without changing a loss), a metric accumulated without evaluation
(named, with the fix), a buffer cache grown by varying shapes (benign, capped by cap_cache, or cleared when
the cap is too loose), mx.compile retracing per shape (compile_cache), and correct loops that raise
nothing."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from leakdoctor._base.schema import SCHEMA
from helpers import has, isolated, kept, mentions, place, says

from leakdoctor.callbacks.mlx import LeakDoctor
from leakdoctor.integrations._mlx import CACHE
from leakdoctor._base.trend import theil_sen
from leakdoctor.remedies._base import RemedyContext
from leakdoctor.remedies.cap_cache import CapCache
from leakdoctor.reporting.summary import Finding

HERE = Path(__file__)
WARMUP = 20
#: Fixed so that materiality (growth against the headroom to the limit) does not depend on the RAM of
#: the machine running the tests.
LIMIT = "8GiB"


def line_of(marker: str) -> int:
    """The line in this file that carries `# <marker>`."""
    return next(i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {marker}"))


def mlp(outputs: int = 1, inputs: int = 64, hidden: int = 128) -> nn.Module:
    model = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, outputs))
    mx.eval(model.parameters())
    return model


def regression_data() -> tuple[mx.array, mx.array]:
    x, y = mx.random.normal((1024, 64)), mx.random.normal((1024, 1))
    mx.eval(x, y)
    return x, y


def batches(steps: int, size: int = 32) -> list[slice]:
    return [slice(i * size % 1024, i * size % 1024 + size) for i in range(steps)]


# --- scenarios (run in their own process) -----------------------------------------------------------

def lazy_loop(steps: int, doctor: LeakDoctor | None) -> list[float]:
    """Updates the model but never evaluates parameters or optimizer state; losses are read at the end."""
    mx.random.seed(0)
    model, opt = mlp(), optim.Adam(1e-3)
    x, y = regression_data()
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    losses = []
    for batch in batches(steps):
        loss, grads = loss_and_grad(model, x[batch], y[batch])
        opt.update(model, grads)  # LAZY-UPDATE
        losses.append(loss)
        if doctor is not None:
            doctor.step(loss=loss)
    return [loss.item() for loss in losses]


def correct_loop(steps: int, doctor: LeakDoctor | None = None) -> list[float]:
    """The same training, evaluated after every step as MLX recommends."""
    mx.random.seed(0)
    model, opt = mlp(), optim.Adam(1e-3)
    x, y = regression_data()
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    losses = []
    for batch in batches(steps):
        loss, grads = loss_and_grad(model, x[batch], y[batch])
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        losses.append(loss.item())
        if doctor is not None:
            doctor.step()
    return losses


def lazy_scenario(remedies: str, steps: int) -> dict:
    # A lazy step only records graph nodes (a fraction of a millisecond: about what one sample costs),
    # so the default 0.5% budget would sample it every ~30 steps. overhead=1.0 lets sampling cost as
    # much as the step and keeps a sample in every window of 6 steps even on a busy machine, which the
    # detection latency asserted below is about (6 windows of 6 steps, then an 8-step investigation).
    doctor = LeakDoctor(remedies=remedies, memory_limit=LIMIT, overhead=1.0, verbose=False)
    with doctor:
        losses = lazy_loop(steps, doctor)
    return {"summary": doctor.summary.to_dict(), "losses": losses, "correct": correct_loop(steps),
            "undoctored": lazy_loop(steps, None)}


def accumulate_loop(steps: int, doctor: LeakDoctor | None, register: bool = False, in_dict: bool = False) -> float:
    """Evaluates the state every step but sums the loss into `total` (or into a metrics dict, as the
    trainers of mlx-lm-lora PR #47 did), evaluated only when there is no doctor (the reference run)."""
    mx.random.seed(0)
    model, opt = mlp(outputs=100), optim.Adam(1e-3)
    x, y = mx.random.normal((1024, 64)), mx.random.randint(0, 100, (1024,))
    mx.eval(x, y)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.cross_entropy(m(a), b, reduction="mean"))
    total, metrics = mx.array(0.0), {"loss": mx.array(0.0)}
    for batch in batches(steps, 64):
        loss, grads = loss_and_grad(model, x[batch], y[batch])
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        if in_dict:
            metrics["loss"] += loss  # ACCUMULATE-DICT
        else:
            total = total + loss  # ACCUMULATE
        if doctor is None:
            mx.eval(total, metrics)
        elif register:
            doctor.step(total=total, metrics=metrics)
        else:
            doctor.step()
    return (metrics["loss"] if in_dict else total).item()


def accumulate_scenario(remedies: str, steps: int, register: bool, in_dict: bool = False) -> dict:
    doctor = LeakDoctor(remedies=remedies, memory_limit=LIMIT, verbose=False)
    with doctor:
        total = accumulate_loop(steps, doctor, register, in_dict)
    return {"summary": doctor.summary.to_dict(), "total": total, "reference": accumulate_loop(steps, None)}


def varying_shapes_scenario(remedies: str, steps: int, validation_spike: bool = False) -> dict:
    """Sequences of a random length each step, with the cache limit raised to 1 GiB: every new length
    leaves buffers of new sizes in MLX's buffer cache while active memory stays flat. With
    `validation_spike`, one large forward pass before training raises the peak far above a step's needs."""
    previous = mx.set_cache_limit(2**30)
    mx.random.seed(0)
    model, opt = mlp(inputs=16, hidden=64), optim.Adam(1e-3)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    sequences = mx.random.normal((4, 256, 16))
    mx.eval(sequences)
    lengths = np.random.default_rng(0).integers(8, 256, size=steps)
    if validation_spike:
        mx.eval(model(mx.random.normal((4, 40_000, 16))))
    with LeakDoctor(model=model, optimizer=opt, remedies=remedies, memory_limit=LIMIT, verbose=False) as doctor:
        for length in lengths:
            x = sequences[:, : int(length)]
            loss, grads = loss_and_grad(model, x, x[..., :1])
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state, loss)
            doctor.step()
    limit_after = mx.set_cache_limit(previous)
    return {"summary": doctor.summary.to_dict(), "limit_after": limit_after, "limit_before": 2**30}


def rows_at(shapes: str, step: int, start: int = 0) -> int:
    """Rows fed on `step`: always 16 ("fixed"); 16 until `start`, then one more each step, a new shape
    every step ("growing"); or one of four bucket sizes in a shuffled order, each traced once ("buckets")."""
    if shapes == "growing":
        return 16 + max(0, step - start)
    return (16, 32, 48, 64)[(step * 7 + step // 4) % 4] if shapes == "buckets" else 16


def compiled_scenario(steps: int, shapes: str, start: int = 0) -> dict:
    """A compiled train step fed `rows_at(shapes, step, start)` rows a step. Every step is sampled
    (overhead=1.0): the tests are about what is found and how soon in steps, not the pacing."""
    mx.random.seed(0)
    model, opt = mlp(inputs=16), optim.SGD(1e-2)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)  # COMPILED
    def train_step(x: mx.array, y: mx.array) -> mx.array:
        loss, grads = loss_and_grad(model, x, y)
        opt.update(model, grads)
        return loss

    data = mx.random.normal((2048, 16))
    mx.eval(data)
    with LeakDoctor(model=model, optimizer=opt, remedies="safe", memory_limit=LIMIT, verbose=False,
                    overhead=1.0) as doctor:
        for step in range(steps):
            x = data[: rows_at(shapes, step, start)]
            loss = train_step(x, x[:, :1])
            mx.eval(state, loss)
            doctor.step()
    return {"summary": doctor.summary.to_dict()}


def lazy_append_scenario(steps: int) -> dict:
    """mlx-examples' compiled MNIST step, its state evaluated after every call, and each batch's training
    accuracy appended to a list without .item() (issue #28's textbook plant): every entry is an
    unevaluated graph that keeps its batch and the parameters of its step."""
    mx.random.seed(0)
    model, opt = mlp(outputs=10, inputs=64), optim.SGD(1e-1)
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.cross_entropy(m(a), b, reduction="mean"))
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def train_step(x: mx.array, y: mx.array) -> mx.array:
        loss, grads = loss_and_grad(model, x, y)
        opt.update(model, grads)
        return loss

    data, labels = mx.random.normal((1024, 64)), mx.random.randint(0, 10, (1024,))
    mx.eval(data, labels)
    accuracies = []
    with LeakDoctor(model=model, optimizer=opt, memory_limit=LIMIT, verbose=False) as doctor:
        for batch in batches(steps):
            x, y = data[batch], labels[batch]
            loss = train_step(x, y)
            mx.eval(state)
            accuracies.append(mx.mean(mx.argmax(model(x), axis=1) == y))  # LAZY-APPEND
            doctor.step()
    return {"summary": doctor.summary.to_dict(), "accuracy": mx.mean(mx.stack(accuracies)).item()}


def unrelated_leak_scenario(steps: int) -> dict:
    """A correct loop that calls doctor.step() before its mx.eval (so the state is unevaluated whenever
    the doctor looks) and keeps a numpy array per step: a leak that is not MLX's."""
    mx.random.seed(0)
    model, opt = mlp(), optim.Adam(1e-3)
    x, y = regression_data()
    loss_and_grad = nn.value_and_grad(model, lambda m, a, b: nn.losses.mse_loss(m(a), b))
    kept = []
    with LeakDoctor(model=model, optimizer=opt, memory_limit=LIMIT, verbose=False) as doctor:
        for batch in batches(steps):
            loss, grads = loss_and_grad(model, x[batch], y[batch])
            opt.update(model, grads)
            kept.append(np.ones(25_000))  # NUMPY-LEAK
            doctor.step()
            mx.eval(model.parameters(), opt.state, loss)
    return {"summary": doctor.summary.to_dict()}


def correct_scenario(steps: int, path: str) -> dict:
    with LeakDoctor(remedies="safe", summary_path=path, verbose=False) as doctor:
        losses = correct_loop(steps, doctor)
    return {"summary": doctor.summary.to_dict(), "losses": losses, "undoctored": correct_loop(steps)}


# --- helpers for assertions --------------------------------------------------------------------------

def only(summary: dict, cause: str, reclaimed_by: str | None = None) -> dict:
    """The one finding of this cause (and reclaimed by this cleanup, if given)."""
    found = [f for f in summary["findings"] if f["cause"] == cause and reclaimed_by in (None, f["reclaimed_by"])]
    assert len(found) == 1, summary["findings"]
    return found[0]


def slope(summary: dict, metric: str, after: int = 0, until: int | None = None) -> float:
    """Theil–Sen slope of a series' recorded points in (after, until]."""
    points = [p for p in summary["series"][metric]["points"] if after < p[0] <= (until or p[0])]
    assert len(points) >= 5, points
    steps, values = zip(*points)
    return theil_sen(steps, values)[0]


# --- tests -------------------------------------------------------------------------------------------

def test_lazy_state_is_found_within_50_steps_and_force_eval_flattens_rss_without_changing_losses():
    result = isolated(lazy_scenario, "safe", 300)
    summary = result["summary"]
    finding = only(summary, "lazy_graph")
    assert finding["metric"] == "rss_bytes"
    assert place(finding).endswith(f"test_mlx.py:{line_of('LAZY-UPDATE')}")
    assert finding["detected_step"] - WARMUP <= 50
    assert finding["rate_per_step"] > 50 * 2**10  # the graph of one MLP step is ~100 KB here
    assert says(finding["evidence"], "active_flat")
    remedy = finding["remedy"]
    assert slope(summary, "mlx_active_bytes", WARMUP, remedy["applied_step"]) < 0.01 * finding["rate_per_step"]
    assert remedy["name"] == "force_eval" and remedy["effective"] is True
    assert remedy["rate_after"] <= 0.1 * finding["rate_per_step"]
    after = slope(summary, "rss_bytes", after=remedy["applied_step"] + 6)
    assert after <= 0.05 * finding["rate_per_step"]  # flat (it may fall: the graph is freed)
    assert summary["verdict"] == "remedied"
    assert result["losses"] == result["correct"]


def test_lazy_state_without_remedies_is_reported_and_the_run_is_unchanged():
    result = isolated(lazy_scenario, "off", 120)
    summary = result["summary"]
    finding = only(summary, "lazy_graph")
    assert finding["metric"] == "rss_bytes" and finding["remedy"] is None
    assert says(finding["recommendation"], "mx_eval_state", extra="")
    assert summary["verdict"] == "leak" and summary["projected_limit_step"] is not None
    assert result["losses"] == result["undoctored"] == result["correct"]


@pytest.mark.parametrize("in_dict, name, marker, registration", [
    (False, "total", "ACCUMULATE", {"key": "total", "expr": "total"}),  # doctor.step(total=total)
    (True, "metrics['loss']", "ACCUMULATE-DICT", {"key": "metrics", "expr": "metrics"}),  # doctor.step(metrics=metrics)
])
def test_accumulated_metric_is_named_with_the_advice_to_evaluate_it(in_dict, name, marker, registration):
    result = isolated(accumulate_scenario, "safe", 160, register=False, in_dict=in_dict)
    summary = result["summary"]
    finding = only(summary, "lazy_graph")
    assert finding["metric"] == "mlx_active_bytes"
    assert place(finding).endswith(f"test_mlx.py:{line_of(marker)}")
    assert says(finding["evidence"], "never_evaluated", "named", name=name)
    assert says(finding["recommendation"], "mx_eval_state", extra=f", {name.split('[')[0]}")
    assert has(finding["recommendation"], "register_with_doctor", **registration)
    assert finding["remedy"] is None  # force_eval cannot reach a variable it was not given
    assert summary["verdict"] == "leak"


def test_registered_total_is_evaluated_by_force_eval_and_keeps_its_value():
    result = isolated(accumulate_scenario, "safe", 260, register=True)
    summary = result["summary"]
    finding = only(summary, "lazy_graph")
    remedy = finding["remedy"]
    assert remedy["name"] == "force_eval" and remedy["effective"] is True
    assert says(remedy["detail"], "registered_evaluated", name="total"), remedy["detail"]
    after = slope(summary, "mlx_active_bytes", after=remedy["applied_step"] + 6)
    assert after <= 0.05 * finding["rate_per_step"]
    assert result["total"] == result["reference"]


def test_growing_buffer_cache_is_benign_and_capped_from_the_working_set():
    result = isolated(varying_shapes_scenario, "safe", 260)
    summary = result["summary"]
    # the C heap may later be found caching what the capped cache gave back (benign, malloc_trim)
    finding = only(summary, "allocator_cache", reclaimed_by="clear_cache")
    # on the cache's own series, whether the investigation started from it or from the resident memory
    assert finding["metric"] == CACHE and finding["benign"] is True
    assert finding["reclaimed_by"] == "clear_cache"  # mx.clear_cache() took it back
    assert says(finding["evidence"], "active_flat")
    remedy = finding["remedy"]
    assert remedy["name"] == "cap_cache" and remedy["effective"] is True, (remedy, summary["notes"], summary["errors"],
                                                                           summary["findings"])
    cap = result["limit_after"]
    assert 0 < cap < result["limit_before"]
    assert says(remedy["detail"], "cache_limit_set", size=f"{cap / 2**20:.1f} MiB"), remedy["detail"]
    cache = summary["series"][CACHE]
    before = max(v for s, v in cache["points"] if s <= remedy["applied_step"])
    after = max(v for s, v in cache["points"] if s > remedy["applied_step"] + 1)
    assert after <= cap < before


def test_too_loose_cap_is_undone_and_clear_cache_takes_over():
    result = isolated(varying_shapes_scenario, "safe", 300, validation_spike=True)
    summary = result["summary"]
    finding = only(summary, "allocator_cache", reclaimed_by="clear_cache")
    assert says(summary["notes"], "did_not_stop", remedy="cap_cache", cause="allocator_cache"), summary["notes"]
    assert result["limit_after"] == result["limit_before"]  # cap_cache's limit was undone
    remedy = finding["remedy"]
    assert remedy["name"] == "clear_cache"
    # How often clearing fits in its 1% time budget depends on the machine, and so does the engine's
    # verdict on the slope between clears on a loaded one; what must happen is that it empties the cache.
    after = [v for s, v in summary["series"][CACHE]["points"] if s > remedy["applied_step"] + 1]
    assert after.count(0.0) >= 2


def test_compile_retrace_per_input_shape_is_compile_cache_named_with_its_shapes():
    summary = isolated(compiled_scenario, 150, "growing")["summary"]
    finding = only(summary, "compile_cache")
    # on the count of traces (an always-on sentinel), whether memory or the count opened the investigation
    assert finding["metric"] == "mlx_compile_traces"
    assert finding["detected_step"] <= 20 + 60  # the leak runs from the start: warm-up, then ~6 windows
    assert place(finding).endswith(f"test_mlx.py:{line_of('COMPILED')}")
    evidence = finding["evidence"]
    assert says(evidence, "traced", function="train_step") and says(evidence, "shapes_changing", argument="x")
    assert mentions(evidence, ", 16) to (") and mentions(evidence, "y (")  # rows change; the columns do not
    assert says(finding["recommendation"], "shapeless", "bucket")
    assert summary["verdict"] == "leak"


def test_retracing_that_starts_after_warm_up_is_found_within_50_steps():
    start = 40
    summary = isolated(compiled_scenario, 200, "growing", start)["summary"]
    finding = only(summary, "compile_cache")
    assert finding["detected_step"] - start <= 50
    assert place(finding).endswith(f"test_mlx.py:{line_of('COMPILED')}")
    assert finding["metric"] == "mlx_compile_traces" and finding["rate_per_step"] >= 0.5  # a graph a step


def test_compiled_loop_with_fixed_shapes_is_clean():
    summary = isolated(compiled_scenario, 200, "fixed")["summary"]
    assert kept(summary) == [] and summary["errors"] == []


def test_compiled_loop_with_bucketed_shapes_is_no_compile_cache():
    summary = isolated(compiled_scenario, 200, "buckets")["summary"]
    assert all(f["cause"] != "compile_cache" for f in summary["findings"]), summary["findings"]
    assert all(f["benign"] for f in summary["findings"]) and summary["errors"] == []


def test_leak_elsewhere_is_not_blamed_on_the_lazy_graph():
    summary = isolated(unrelated_leak_scenario, 120)["summary"]
    assert summary["findings"], "the numpy leak is found"
    assert all(f["cause"] != "lazy_graph" for f in summary["findings"]), summary["findings"]
    assert any(f["metric"] == "rss_bytes" and place(f) and place(f).endswith(f"test_mlx.py:{line_of('NUMPY-LEAK')}")
               for f in summary["findings"]), summary["findings"]


def test_unevaluated_metrics_kept_in_a_list_are_named_at_the_append():
    summary = isolated(lazy_append_scenario, 300)["summary"]
    located = [f for f in summary["findings"] if f["cause"] in ("lazy_graph", "device_arrays")]
    assert located, summary["findings"]
    finding = located[0]
    assert finding["cause"] == "lazy_graph" and finding["metric"] == "mlx_active_bytes"
    assert finding["state"] == "leak" and summary["verdict"] == "leak"
    assert place(finding).startswith("accuracies in lazy_append_scenario()")
    assert place(finding).endswith(f"test_mlx.py:{line_of('LAZY-APPEND')})")
    assert "native_memory" not in {f["cause"] for f in summary["findings"]}, summary["findings"]


def test_correct_loop_of_500_steps_has_no_finding(tmp_path):
    path = tmp_path / "leaks.json"
    result = isolated(correct_scenario, 500, str(path))
    summary = result["summary"]
    assert kept(summary) == [] and summary["errors"] == [] and summary["verdict"] == "clean"
    assert summary["steps"] == 500
    assert result["losses"] == result["undoctored"]
    written = json.loads(path.read_text())
    assert written["framework"] == "mlx" and written["schema"] == SCHEMA
    assert {"mlx_active_bytes", "mlx_cache_bytes", "mlx_peak_bytes"} <= set(written["series"])


def test_cap_cache_undo_restores_the_previous_limit():
    previous = mx.set_cache_limit(2**30)
    try:
        finding = Finding("allocator_cache", CACHE, 1, 2, 1.0, "bytes", None, "", "", benign=True,
                          reclaimed_by="clear_cache")
        ctx = RemedyContext(finding, {})
        remedy = CapCache()
        assert remedy.applicable(ctx)
        remedy.apply(ctx)
        cap = mx.set_cache_limit(2**30)
        mx.set_cache_limit(cap)
        assert cap == max(0, mx.get_peak_memory() - mx.get_active_memory())
        assert remedy.undo(ctx) is True
        assert mx.set_cache_limit(2**30) == 2**30
    finally:
        mx.set_cache_limit(previous)


@pytest.mark.parametrize("kwargs, bad", [
    ({"model": "model"}, "model='model'"),
    ({"optimizer": object()}, "optimizer=<object"),
    ({"memory_limit": "lots"}, "memory_limit='lots'"),
    ({"remedies": ["force_eval", "evaluate"]}, "evaluate"),
])
def test_bad_arguments_fail_at_construction(kwargs, bad):
    with pytest.raises(ValueError, match=bad.replace("(", r"\(")):
        LeakDoctor(verbose=False, **kwargs)


#: A script whose loop runs at module level, keeping the model's unevaluated outputs in a global list after
#: evaluating the state each step (the issue's `history.append(model(X))` after `mx.eval(state)`).
GLOBAL_HISTORY = '''
import json
from functools import partial
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from leakdoctor.callbacks.mlx import LeakDoctor

model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = optim.SGD(learning_rate=0.01)
state = [model.state, optimizer.state]
X = mx.random.normal((64, 32)); y = mx.random.randint(0, 10, (64,))

def loss_fn(model, X, y):
    return nn.losses.cross_entropy(model(X), y).mean()

@partial(mx.compile, inputs=state, outputs=state)
def step(X, y):
    loss, grads = nn.value_and_grad(model, loss_fn)(model, X, y)
    optimizer.update(model, grads)
    return loss

history = []
with LeakDoctor(model=model, optimizer=optimizer, summary_path="leaks.json", verbose=False) as doctor:
    for i in range(800):
        loss = step(X, y)
        mx.eval(state)
        history.append(model(X))  # HISTORY-APPEND
        doctor.step()
print(json.dumps(doctor.summary.to_dict()))
'''


def test_unevaluated_outputs_in_a_global_list_are_one_finding_at_the_append(tmp_path):
    """One bug, one finding: the list at the append line, which resident memory's growth is part of too
    (the investigation's window may grow resident memory more than the leak does)."""
    import subprocess
    import sys

    script = tmp_path / "history.py"
    script.write_text(GLOBAL_HISTORY)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.splitlines()[-1])
    line = next(i for i, text in enumerate(GLOBAL_HISTORY.splitlines(), 1) if text.endswith("# HISTORY-APPEND"))
    assert [(f["cause"], f["metric"], place(f)) for f in summary["findings"]] == [
        ("lazy_graph", "mlx_active_bytes", f"global history (history.py:{line})")]
    assert summary["findings"][0]["state"] == "leak"
