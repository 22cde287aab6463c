"""JAX, Flax, Optax, Equinox on real training loops (CPU), each in a fresh process: the old optax RAdam
(an un-jitted lax.cond over closures) compiling every step in a Flax TrainState loop, found and swapped
by cond_to_where; the same in a Flax NNX loop and an Equinox loop with bare optax; a jitted step re-traced because a
Python scalar changes every step (compile_cache named after the function, memory bounded by
jax.clear_caches under remedies="safe"); arrays kept across steps (device_arrays); and a healthy
optax.adam loop of 500 steps that raises nothing and trains exactly as without the doctor."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx
from flax.training import train_state
from helpers import corpus_run, has, isolated, kept, mentions, says, place

from leakdoctor.callbacks.jax import LeakDoctor
from leakdoctor.examples import old_radam as old_radam_module
from leakdoctor.examples.old_radam import old_radam
from leakdoctor.integrations import MetricSpec
from leakdoctor.integrations._jax import ArrayGrowth, compile_cache, live_arrays
from leakdoctor._base.trend import Trend, theil_sen
from leakdoctor._base.evidence import Evidence, Ladder

HERE = Path(__file__)
#: The old RAdam's source: findings about its lax.cond point there.
OLD_RADAM = Path(old_radam_module.__file__)
WARMUP = 20
#: Fixed so that materiality (growth against the headroom to the limit) does not depend on the RAM of
#: the machine running the tests.
LIMIT = "8GiB"


def line_of(marker: str, path: Path = HERE) -> int:
    """The line of `path` (this file by default) that carries `# <marker>`."""
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {marker}"))


# --- models and data -----------------------------------------------------------------------------------

class MLP(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return linen.Dense(1)(linen.relu(linen.Dense(64)(x)))


def regression() -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
    return x, jnp.sin(x).sum(1, keepdims=True)


def flax_state(tx: optax.GradientTransformation, model: linen.Module | None = None) -> train_state.TrainState:
    model, (x, _) = model or MLP(), regression()
    return train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.PRNGKey(0), x), tx=tx)


@jax.jit
def loss_and_grads(state: train_state.TrainState, x: jax.Array, y: jax.Array) -> Any:
    return jax.value_and_grad(lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(state.params)


def compiles_after(summary: dict, step: int) -> float:
    points = [v for s, v in summary["series"]["jax_compiles"]["points"] if s > step]
    return points[-1] - points[0]


def slope(summary: dict, metric: str, after: int, until: int | None = None) -> float:
    points = [(s, v) for s, v in summary["series"][metric]["points"] if s > after and (until is None or s <= until)]
    return theil_sen(*zip(*points))[0]


def only(summary: dict, cause: str) -> dict:
    found = [f for f in summary["findings"] if f["cause"] == cause]
    assert len(found) == 1, summary["findings"]
    return found[0]


# --- scenarios (run in their own process) ---------------------------------------------------------------

def radam_flax_scenario(remedies: str, steps: int) -> dict:
    """A Flax TrainState loop: jitted gradients, the optimizer applied un-jitted (state.apply_gradients).
    A linear model: each eager step compiles, the fewer parameters the faster."""
    tx = old_radam(1e-2)
    state = flax_state(tx, linen.Dense(1))
    x, y = regression()
    losses = []
    with LeakDoctor(remedies=remedies, memory_limit=LIMIT, verbose=False) as doctor:
        for _ in range(steps):
            loss, grads = loss_and_grads(state, x, y)
            state = state.apply_gradients(grads=grads)
            losses.append(float(loss))
            state = doctor.step(state)
    return {"summary": doctor.summary.to_dict(), "losses": losses, "swapped": state.tx is not tx,
            "same_opt_state_structure": jax.tree_util.tree_structure(state.opt_state)
            == jax.tree_util.tree_structure(tx.init(state.params))}


def adam_jitted_scenario(steps: int) -> dict:
    """The healthy loop: optax.adam inside a jitted step. Trained twice, with and without the doctor."""
    x, y = regression()

    @jax.jit
    def train_step(state: train_state.TrainState) -> Any:
        loss, grads = loss_and_grads(state, x, y)
        return state.apply_gradients(grads=grads), loss

    def train(doctor: LeakDoctor | None) -> list[float]:
        state, losses = flax_state(optax.adam(1e-3)), []
        for _ in range(steps):
            state, loss = train_step(state)
            losses.append(float(loss))
            if doctor is not None:
                state = doctor.step(state)
        return losses

    reference = train(None)
    with LeakDoctor(memory_limit=LIMIT, verbose=False) as doctor:
        losses = train(doctor)
    return {"summary": doctor.summary.to_dict(), "losses": losses, "reference": reference}


def retrace_scenario(remedies: str, steps: int) -> dict:
    """A jitted Flax step whose learning rate is a static argument that changes every step."""
    x, y = regression()

    @functools.partial(jax.jit, static_argnames="lr")  # RETRACED-STEP
    def train_step(state: train_state.TrainState, lr: float) -> Any:
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(state.params)
        return state.apply_gradients(grads=jax.tree_util.tree_map(lambda g: lr * g, grads)), loss

    state = flax_state(optax.sgd(1.0))
    # Small windows and a short investigation: each step compiles (0.3 to 1 s on a loaded 2-core
    # machine), so the default windows would take minutes.
    with LeakDoctor(remedies=remedies, memory_limit=LIMIT, verbose=False, warmup=10, window=4,
                    investigate_steps=4, verify_windows=4) as doctor:
        for i in range(steps):
            state, _ = train_step(state, lr=0.05 / (1 + i) ** 0.5)
            state = doctor.step(state)
    return {"summary": doctor.summary.to_dict()}


def jit_lambda_scenario(steps: int) -> dict:
    """A jitted Flax step, and each step's batch normalised by `jax.jit` of a new lambda (the textbook
    flax_jit_lambda scenario, issue #28): a compile every step, whose executables stay cached."""
    images = jax.random.uniform(jax.random.PRNGKey(2), (32, 28 * 28))
    y = images.mean(1, keepdims=True)

    @jax.jit
    def train_step(state: train_state.TrainState, x: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(state.params)
        return state.apply_gradients(grads=grads), loss

    model = MLP()
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.PRNGKey(0), images),
                                          tx=optax.sgd(0.01))
    with LeakDoctor(memory_limit=LIMIT, overhead=1.0, verbose=False) as doctor:
        for _ in range(steps):
            batch = jax.jit(lambda v: (v - 0.1307) / 0.3081)(images)  # JIT-LAMBDA
            state, _ = train_step(state, batch)
            state = doctor.step(state)
    return {"summary": doctor.summary.to_dict()}


def radam_nnx_scenario(steps: int) -> dict:
    """A Flax NNX loop: nnx.Optimizer with the old RAdam, its update run un-jitted."""
    model = nnx.Linear(16, 1, rngs=nnx.Rngs(0))
    tx = old_radam(1e-2)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    x, y = regression()

    @nnx.jit
    def grads_of(model: nnx.Module) -> Any:
        return nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)

    # Small windows: an un-jitted RAdam step compiles (about 0.2 s); the swap is what is tested here.
    with LeakDoctor(optimizer=optimizer, model=model, remedies="all", memory_limit=LIMIT, verbose=False,
                    warmup=10, window=4, investigate_steps=4, verify_windows=4) as doctor:
        for _ in range(steps):
            _, grads = grads_of(model)
            optimizer.update(model, grads)
            doctor.step()
    return {"summary": doctor.summary.to_dict(), "swapped": optimizer.tx is not tx}


def radam_equinox_scenario(steps: int) -> dict:
    """An Equinox model trained by a bare optax loop (eqx.filter_jit gradients, the update un-jitted),
    through doctor.tx."""
    x, y = regression()
    model = eqx.nn.Linear(16, 1, key=jax.random.PRNGKey(0))
    grads_of = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2)))
    # Small windows, as in the NNX scenario.
    with LeakDoctor(tx=old_radam(1e-2), remedies="all", memory_limit=LIMIT, verbose=False, warmup=10,
                    window=4, investigate_steps=4, verify_windows=4) as doctor:
        tx = doctor.tx
        params = eqx.filter(model, eqx.is_array)
        opt_state = tx.init(params)
        for _ in range(steps):
            _, grads = grads_of(model)
            updates, opt_state = tx.update(grads, opt_state, params)
            model = eqx.apply_updates(model, updates)
            params = eqx.filter(model, eqx.is_array)
            doctor.step(opt_state=opt_state, params=params)
    return {"summary": doctor.summary.to_dict()}


def kept_arrays_scenario(steps: int) -> dict:
    """A jitted loop that keeps every step's activations in a list."""
    x = jax.random.normal(jax.random.PRNGKey(2), (256, 256))
    w = jnp.eye(256) * 0.5
    step = jax.jit(lambda w, x: (w + 1e-4 * jnp.tanh(x @ w), jnp.tanh(x @ w) @ w))
    kept = []
    with LeakDoctor(memory_limit=LIMIT, verbose=False) as doctor:
        for _ in range(steps):
            w, activations = step(w, x)
            kept.append(activations)  # KEPT
            doctor.step()
    return {"summary": doctor.summary.to_dict()}


def kept_grads_scenario(steps: int) -> dict:
    """An NNX loop that keeps every step's gradients (nnx.State pytrees, the arrays 4 levels inside)."""
    model = nnx.Linear(256, 256, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(3), (64, 256))
    grad = nnx.jit(nnx.grad(lambda m, x: jnp.mean(m(x) ** 2)))
    history = []
    with LeakDoctor(memory_limit=LIMIT, verbose=False) as doctor:
        for _ in range(steps):
            history.append(grad(model, x))  # KEPT-GRADS
            doctor.step()
    return {"summary": doctor.summary.to_dict()}


# --- tests --------------------------------------------------------------------------------------------

def test_old_radam_in_a_flax_loop_is_found_and_swapped_by_cond_to_where():
    remedied = isolated(radam_flax_scenario, "all", 120)
    summary = remedied["summary"]
    finding = only(summary, "compile_cache")
    assert finding["metric"] == "jax_compiles"
    assert finding["detected_step"] - WARMUP <= 50
    assert place(finding).endswith(f"leakdoctor/examples/old_radam.py:{line_of('RADAM-COND', OLD_RADAM)}")
    assert says(finding["evidence"], "jax_compiled", function="cond") and mentions(finding["evidence"], "update_fn")
    assert mentions(finding["evidence"], "_radam_update") and says(finding["recommendation"], "jit_the_update")
    remedy = finding["remedy"]
    assert remedy["name"] == "cond_to_where" and remedy["effective"] is True and remedy["rate_after"] == 0
    assert remedied["swapped"] and remedied["same_opt_state_structure"]
    applied = remedy["applied_step"]
    assert compiles_after(summary, applied + 5) == 0
    before = slope(summary, "rss_bytes", WARMUP, applied)
    assert before > 500_000  # the leak: about a megabyte per step of compiled conds
    assert abs(slope(summary, "rss_bytes", applied + 10)) <= 0.05 * before
    assert summary["verdict"] == "remedied" and summary["errors"] == []

    unremedied = isolated(radam_flax_scenario, "off", 120)
    finding = only(unremedied["summary"], "compile_cache")
    assert finding["remedy"] is None and unremedied["summary"]["verdict"] == "leak"
    assert not unremedied["swapped"]
    # The eager original computes b2 ** count with integer_pow on the concrete count, any traced version
    # (jitted or rewritten) with pow: float32 rounding that training amplifies to ~5e-4 by step 60. The
    # rewrite matches the jitted original to 2e-7 (test_jax_cond_to_where.py).
    np.testing.assert_allclose(remedied["losses"], unremedied["losses"], rtol=2e-3)


def test_adam_in_a_jitted_step_has_no_finding_over_500_steps():
    result = isolated(adam_jitted_scenario, 500)
    summary = result["summary"]
    assert kept(summary) == [] and summary["errors"] == [] and summary["verdict"] == "clean"
    assert summary["steps"] == 500
    assert result["losses"] == result["reference"]
    assert summary["series"]["jax_compiles"]["trend"] == "flat"


def test_step_retraced_by_a_changing_python_scalar_is_compile_cache_named_after_it():
    summary = isolated(retrace_scenario, "safe", 56)["summary"]
    finding = only(summary, "compile_cache")
    assert place(finding).endswith(f"test_jax_leaks.py:{line_of('RETRACED-STEP')}")
    assert says(finding["evidence"], "traced_again", "jax_compiled", function="train_step")
    assert mentions(finding["evidence"], "lr")  # the argument that changes
    assert says(finding["recommendation"], "as_arrays")
    assert finding["metric"] == "rss_bytes"
    remedy = finding["remedy"]
    assert remedy["name"] == "clear_cache" and says(remedy["detail"], "clears", name="clear_compile_cache")
    assert remedy["effective"] is True


def test_a_new_lambda_jitted_every_step_is_one_compile_cache_finding_at_its_line():
    summary = isolated(jit_lambda_scenario, 300)["summary"]
    finding = only(summary, "compile_cache")  # one finding per cause and place, whichever metrics showed it
    path, _, line = place(finding).rpartition(":")  # 'file:line', as every compile_cache finding is placed
    assert Path(path).resolve() == HERE.resolve() and int(line) == line_of("JIT-LAMBDA"), place(finding)
    assert finding["state"] == "leak" and finding["severity"] == "major"
    assert summary["verdict"] == "leak"
    metrics = [finding["metric"], *(other["metric"] for other in finding["supporting"])]
    assert sorted(metrics) == sorted(set(metrics)) and set(metrics) <= {"jax_compiles", "rss_bytes"}, metrics
    assert [f["cause"] for f in summary["findings"] if f["state"] != "withdrawn"] == ["compile_cache"]


def test_nnx_optimizer_gets_the_rewritten_transformation_in_place():
    result = isolated(radam_nnx_scenario, 58)
    finding = only(result["summary"], "compile_cache")
    assert place(finding).endswith(f"leakdoctor/examples/old_radam.py:{line_of('RADAM-COND', OLD_RADAM)}")
    assert finding["remedy"]["name"] == "cond_to_where" and finding["remedy"]["effective"] is True
    assert result["swapped"]
    assert compiles_after(result["summary"], finding["remedy"]["applied_step"] + 3) == 0


def test_equinox_loop_with_bare_optax_follows_the_swap_through_doctor_tx():
    summary = isolated(radam_equinox_scenario, 58)["summary"]
    finding = only(summary, "compile_cache")
    assert place(finding).endswith(f"leakdoctor/examples/old_radam.py:{line_of('RADAM-COND', OLD_RADAM)}")
    assert finding["remedy"]["name"] == "cond_to_where" and finding["remedy"]["effective"] is True
    assert compiles_after(summary, finding["remedy"]["applied_step"] + 3) == 0


def test_arrays_kept_across_steps_are_device_arrays_held_by_the_list_that_keeps_them():
    summary = isolated(kept_arrays_scenario, 150)["summary"]
    finding = only(summary, "device_arrays")
    # on the live bytes, the exact measure, also when resident memory (the same bytes on CPU) grew first
    assert finding["metric"] == "jax_live_bytes_cpu"
    assert place(finding) == f"kept in kept_arrays_scenario() (tests/test_jax_leaks.py:{line_of('KEPT')})"
    assert says(finding["evidence"], "array_kind", dtype="float32", shape="256,256", platform="cpu")
    assert says(finding["evidence"], "held_by", holders="kept in kept_arrays_scenario()")
    assert says(finding["recommendation"], "store_floats", holder="kept")
    assert not any(f["cause"] == "native_memory" for f in summary["findings"])


def test_gradient_states_kept_across_steps_are_named_at_the_list_that_keeps_them():
    summary = isolated(kept_grads_scenario, 150)["summary"]
    finding = only(summary, "device_arrays")
    assert place(finding) == f"history in kept_grads_scenario() (tests/test_jax_leaks.py:{line_of('KEPT-GRADS')})"
    assert says(finding["evidence"], "array_kind", dtype="float32", shape="256,256", platform="cpu")
    assert says(finding["evidence"], "held_by", holders="history in kept_grads_scenario()")
    assert not mentions(finding["evidence"], "model in")  # the model holds its current parameters only: not a holder


@pytest.mark.parametrize("kwargs, bad", [
    ({"tx": "adam"}, "tx='adam'"),
    ({"optimizer": object(), "model": object()}, "optimizer=<object"),
    ({"model": object()}, "optimizer= and model="),
    ({"remedies": "some"}, "remedies='some'"),
])
def test_bad_arguments_fail_at_construction(kwargs, bad):
    with pytest.raises(ValueError, match=bad.replace("(", r"\(")):
        LeakDoctor(**kwargs)


def test_doctor_tx_needs_tx():
    doctor = LeakDoctor(verbose=False)
    with pytest.raises(ValueError, match="tx="):
        doctor.tx  # noqa: B018
    doctor.finish()


def memory_first_evidence(first_half: int, second_half: int) -> Evidence:
    """An investigation of 4 steps opened on resident memory alone (+3 MiB a step, kept through both
    halves), the compile count not among its suspects (read every few samples, its windows were too few
    yet), rising by `first_half` and `second_half` in the halves of the window."""
    mib = 2**20
    specs = {"rss_bytes": MetricSpec("rss_bytes", "bytes", source="process"),
             "jax_compiles": MetricSpec("jax_compiles", "count", source="jax")}

    def ladder(step: int, rss: float, compiles: float) -> Ladder:
        return Ladder([("before", {"rss_bytes": rss, "jax_compiles": compiles})], step=step)

    rss = Trend("growing", slope=3 * mib)
    return Evidence(start_step=35, end_step=39, suspects={"rss_bytes": rss}, trends={"rss_bytes": rss}, specs=specs,
                    begin=ladder(35, 500 * mib, 60), middle=ladder(37, 506 * mib, 60 + first_half),
                    end=ladder(39, 512 * mib, 60 + first_half + second_half), reports={})


def test_compiles_that_grew_resident_memory_first_are_compile_cache_not_native_memory():
    (found,) = compile_cache(memory_first_evidence(4, 4), [])
    assert (found.cause, found.metric) == ("compile_cache", "rss_bytes")
    assert set(found.explains) == {"jax_compiles", "rss_bytes"}
    assert has(found.evidence["params"]["facts"][0], "grew", metric="jax_compiles", growth=8, steps=4, rate=2), \
        found.evidence  # what it says first: the growth
    assert compile_cache(memory_first_evidence(8, 0), []) == []  # a burst of compiles, then none: no loop
    assert compile_cache(memory_first_evidence(1, 0), []) == []


def test_a_jit_cache_of_bucketed_shapes_that_fills_then_plateaus_is_clean():
    """issue #10: the corpus's jax_bucketed_shapes (sequences padded to four lengths, each compiled once
    as it first comes) was a false alarm; the run must end clean."""
    summary = isolated(corpus_run, "jax_bucketed_shapes")
    assert summary["verdict"] == "clean" and kept(summary) == [], (summary["findings"], summary["notes"])


def test_arrays_kept_at_a_third_of_the_suspected_rate_are_device_arrays_when_the_window_saw_more():
    """nnx_state_cache (textbook benchmark, 1 run in 3): resident memory alone raised the suspicion at
    294 KiB a step, the window saw 686 KiB a step (malloc's noise), and the arrays kept in it were 204 KiB
    a step: under a third of the window's growth, most of the suspected rate. They are the leak, not
    native memory that no counter accounts for."""
    kib = 2**10
    specs = {"rss_bytes": MetricSpec("rss_bytes", "bytes", source="process")}

    def ladder(step: int, rss: float) -> Ladder:
        return Ladder([("before", {"rss_bytes": rss})], step=step)

    rss = Trend("growing", slope=294 * kib)
    growth = ArrayGrowth([("float32[784,64] on cpu", 8, 8 * 200 * kib), ("float32[64,10] on cpu", 8, 8 * 4 * kib)])
    ev = Evidence(start_step=56, end_step=64, suspects={"rss_bytes": rss}, trends={"rss_bytes": rss}, specs=specs,
                  begin=ladder(56, 400 * 2**20), middle=ladder(60, 400 * 2**20 + 4 * 686 * kib),
                  end=ladder(64, 400 * 2**20 + 8 * 686 * kib), reports={"jax_live_arrays": growth})
    (found,) = live_arrays(ev, [])
    assert (found.cause, found.metric) == ("device_arrays", "rss_bytes") and "rss_bytes" in found.explains
    thin = ArrayGrowth([("float32[64,10] on cpu", 8, 8 * 40 * kib)])  # a tenth of the rate: not the cause
    assert live_arrays(Evidence(**{**ev.__dict__, "reports": {"jax_live_arrays": thin}, "notes": {}}), []) == []
