"""JAX: the old optax RAdam (optax <= 0.2.2, an un-jitted lax.cond over closures) in a Flax TrainState
loop: memory and compiles per step as written, rewritten by cond_to_where, and with its update jitted;
what the doctor does with it (remedies="all"); and what the doctor costs on a healthy jitted loop.

RSS slope: Theil-Sen over the resident size read after every step (steps 10 to the end). Step times are
medians of per-step CPU time of this process (time.process_time): the machine is shared, and the costs
compared here are CPU work. The overhead ratio is a median over pairs of runs with and without the doctor
(benchmarks.common.paired_ratio).

Run: .venv/bin/python benchmarks/run.py jax_radam
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import linen
from flax.training import train_state

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import machine, paired_ratio, table, write_section  # noqa: E402
from test_jax_leaks import flax_state, loss_and_grads, regression  # noqa: E402

from leakdoctor.callbacks.flax import LeakDoctor  # noqa: E402
from leakdoctor.examples.old_radam import old_radam  # noqa: E402
from leakdoctor.integrations._jax import compile_listener  # noqa: E402
from leakdoctor.integrations._process import RssReader  # noqa: E402
from leakdoctor._base.trend import theil_sen  # noqa: E402
from leakdoctor.remedies.cond_to_where import cond_to_where  # noqa: E402

STEPS = 60
PAIRS = 5
HEALTHY_STEPS = 400
CONFIGURATIONS = {
    "as written (eager lax.cond)": lambda tx: tx,
    "cond_to_where(tx)": cond_to_where,
    "update jitted: tx._replace(update=jax.jit(tx.update))": lambda tx: tx._replace(update=jax.jit(tx.update)),
}


def measure(tx: optax.GradientTransformation) -> dict:
    """RSS slope, compiles per step and CPU time per step of the un-jitted optimizer loop."""
    state, (x, y) = flax_state(tx), regression()
    rss, listener = RssReader(), compile_listener()
    readings, times = [], []
    for step in range(STEPS):
        start, compiles = time.process_time(), listener.count
        loss, grads = loss_and_grads(state, x, y)
        state = state.apply_gradients(grads=grads)
        float(loss)
        times.append(time.process_time() - start)
        readings.append((step, rss(), listener.count - compiles))
    tail = readings[10:]
    return {"rss_slope": theil_sen([s for s, _, _ in tail], [r for _, r, _ in tail])[0],
            "compiles": sum(c for _, _, c in tail) / len(tail), "step": statistics.median(times[10:])}


def doctor_run(steps: int = 130) -> dict:
    state, (x, y) = flax_state(old_radam(1e-2)), regression()
    with LeakDoctor(remedies="all", verbose=False) as doctor:
        for _ in range(steps):
            loss, grads = loss_and_grads(state, x, y)
            state = state.apply_gradients(grads=grads)
            float(loss)
            state = doctor.step(state)
    return doctor.summary.to_dict()


class Wide(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return linen.Dense(1)(linen.relu(linen.Dense(256)(linen.relu(linen.Dense(256)(x)))))


def healthy_loop(steps: int, with_doctor: bool) -> float:
    """CPU seconds per step of optax.adam in a jitted step of a wider MLP (a few ms per step; warm:
    compiled beforehand)."""
    model = Wide()
    x = jax.random.normal(jax.random.PRNGKey(0), (256, 64))
    y = jnp.sin(x).sum(1, keepdims=True)
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.PRNGKey(1), x),
                                          tx=optax.adam(1e-3))

    @jax.jit
    def train_step(state):
        loss, grads = loss_and_grads(state, x, y)
        return state.apply_gradients(grads=grads), loss

    state, _ = train_step(state)
    doctor = LeakDoctor(verbose=False) if with_doctor else None
    start = time.process_time()
    for _ in range(steps):
        state, loss = train_step(state)
        float(loss)
        if doctor is not None:
            state = doctor.step(state)
    seconds = (time.process_time() - start) / steps
    if doctor is not None:
        healthy_loop.fraction.append(doctor.finish().overhead["fraction_of_step_time"])  # type: ignore[attr-defined]
        healthy_loop.step.append(seconds)  # type: ignore[attr-defined]
    return seconds


healthy_loop.fraction = []  # type: ignore[attr-defined]
healthy_loop.step = []  # type: ignore[attr-defined]


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def fresh(*args: str) -> dict:
    """Run this script's measurement `args` in a fresh process (nothing compiled yet) and read its JSON."""
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    rows = []
    for name in CONFIGURATIONS:
        m = fresh("measure", name)
        rows.append([name, mib(m["rss_slope"]) + "/step", f"{m['compiles']:.2f}", f"{m['step'] * 1e3:.2f} ms"])
    summary = fresh("doctor")
    finding = next(f for f in summary["findings"] if f["cause"] == "compile_cache")
    remedy = finding["remedy"]
    ratio, ratios = paired_ratio(lambda: healthy_loop(HEALTHY_STEPS, False),
                                 lambda: healthy_loop(HEALTHY_STEPS, True), PAIRS)
    low, _, high = statistics.quantiles(ratios, n=4)
    write_section("jax_radam", f"""
## JAX: the old optax RAdam (un-jitted lax.cond over closures, optax#969)

`.venv/bin/python benchmarks/run.py jax_radam` on {machine()}, jax {jax.__version__}, optax
{optax.__version__}. A Flax TrainState loop (MLP 16-64-1, batch 64): gradients jitted, the optimizer
applied un-jitted by `state.apply_gradients`, {STEPS} steps per configuration, each in a fresh process; RSS
slope over steps 10 to {STEPS} (Theil-Sen), median CPU time per step.

{table(["optimizer update", "RSS growth", "backend compiles per step", "step time (CPU)"], rows)}

The eager original compiles a `cond` (its branch is a new closure every call) and an `integer_pow`
(`b2 ** count` on the concrete count) on every step, and keeps every executable.

With `LeakDoctor(remedies="all")` on that loop, in a fresh process (defaults: warm-up 20, windows of 6
steps): compile_cache on {finding['metric']} ({finding['rate_per_step']:.0f}/step) reported at step
{finding['detected_step']} ({finding['detected_step'] - 20} steps after warm-up) at `{finding['location']}`;
cond_to_where applied at step {remedy['applied_step']}, verified effective: {remedy['effective']}, compiles per
step after: {remedy['rate_after']:.0f}; verdict {summary['verdict']}.

Doctor overhead on a healthy loop (MLP 64-256-256-1, batch 256, optax.adam in a jitted step,
{statistics.median(healthy_loop.step) * 1e3:.1f} ms of CPU per step, {HEALTHY_STEPS} steps per run, {PAIRS} pairs):
CPU time per step with / without the doctor {ratio:.3f} (middle half of pairs {low:.3f}-{high:.3f}); the
doctor's own account (time inside `step()`), median: {statistics.median(healthy_loop.fraction):.2%} of step time.
""")


if __name__ == "__main__":
    if sys.argv[1:2] == ["measure"]:
        print(json.dumps(measure(CONFIGURATIONS[sys.argv[2]](old_radam(1e-2)))))
    elif sys.argv[1:2] == ["doctor"]:
        print(json.dumps(doctor_run()))
    else:
        main()
