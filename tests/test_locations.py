"""Findings are placed at the line of the user's code that grows, whatever the framework (issue #28): an
Equinox step retraced every step at the user's line that calls it (not equinox's wrapper in
site-packages), a Flax NNX step at its definition in the user's file (also on the compile count, where it
was a bare 'jit(_train_step)'), and a watched object's growing list at the line that appends to it (not
the `class` line), with what it stores in the fix. Each scenario runs in a fresh process (helpers.isolated),
sampled every step (overhead=1.0), so that the test does not depend on pacing."""

from __future__ import annotations

from pathlib import Path

from helpers import isolated, says, place

from leakdoctor._base.source import stored_value

HERE = Path(__file__)
#: Fixed so that materiality does not depend on the RAM of the machine running the tests; HUGE makes
#: resident memory's growth immaterial, so that a compile_cache finding stands on the compile count.
LIMIT, HUGE = "8GiB", "1000TiB"
#: Small windows and a short investigation: every step compiles (0.1 to 1 s on a loaded 2-core machine).
JAX_WINDOWS = dict(warmup=10, window=4, investigate_steps=4, verify_windows=4, overhead=1.0, verbose=False)


def line_of(marker: str) -> int:
    """The line of this file that carries `# <marker>`."""
    return next(i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {marker}"))


def at(marker: str) -> str:
    return f"{HERE.name}:{line_of(marker)}"


def only(summary: dict, cause: str) -> dict:
    found = [f for f in summary["findings"] if f["cause"] == cause]
    assert len(found) == 1, ([(f["cause"], f["metric"], place(f)) for f in summary["findings"]], summary["notes"])
    return found[0]


def in_users_file(location: str) -> bool:
    return "site-packages" not in location and "dist-packages" not in location and "leakdoctor/" not in location


# --- scenarios (run in their own process) ---------------------------------------------------------------

def equinox_retraced(steps: int, memory_limit: str) -> dict:
    """An eqx.filter_jit step given a new static Python int every step: equinox's wrapper (defined in
    site-packages) is what jax says it traced again."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from leakdoctor.callbacks.jax import LeakDoctor

    model = eqx.nn.Linear(16, 1, key=jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 16))

    @eqx.filter_jit
    def step(model: eqx.nn.Linear, x: jax.Array, scale: int) -> jax.Array:
        return jnp.mean(jax.vmap(model)(x) ** 2) * scale

    with LeakDoctor(memory_limit=memory_limit, **JAX_WINDOWS) as doctor:
        for i in range(steps):
            step(model, x, i)  # EQX-CALL
            doctor.step()
    return doctor.summary.to_dict()


def nnx_retraced(steps: int, memory_limit: str) -> dict:
    """An nnx.jit step whose module carries a Python int that changes every step: the module's graph
    (static to nnx.jit) is new on every call."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from leakdoctor.callbacks.jax import LeakDoctor

    class Model(nnx.Module):
        def __init__(self) -> None:
            self.linear = nnx.Linear(16, 1, rngs=nnx.Rngs(0))
            self.seen = 0

    model = Model()
    optimizer = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
    x = jnp.ones((8, 16))

    @nnx.jit  # NNX-STEP
    def _train_step(model: Model, optimizer: nnx.Optimizer) -> jnp.ndarray:
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m.linear(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    with LeakDoctor(model=model, optimizer=optimizer, memory_limit=memory_limit, **JAX_WINDOWS) as doctor:
        for _ in range(steps):
            model.seen += 1
            _train_step(model, optimizer)
            doctor.step()
    return doctor.summary.to_dict()


class Trainer:
    """A plain-Python trainer that keeps a record of every step."""

    def __init__(self) -> None:
        self.history: list = []
        self.steps = 0

    def train_step(self) -> None:
        self.steps += 1
        self.history.append(bytearray(200_000))  # TRAINER-APPEND

    def restart(self) -> None:
        self.history.insert(0, bytearray(1))  # never called: a store the investigation does not see run


def make_record() -> bytearray:
    return bytearray(200_000)


def watched_trainer(steps: int, appended_by_loop: bool) -> dict:
    """`doctor.watch_object(trainer)` on a plain loop whose trainer's list grows by 195 KiB a step: appended
    in the trainer's method, or by the loop itself with a record made on the line before."""
    from leakdoctor import LeakDoctor

    trainer = Trainer()
    with LeakDoctor(memory_limit=LIMIT, verbose=False, overhead=1.0) as doctor:
        doctor.watch_object(trainer)
        for _ in range(steps):
            if appended_by_loop:
                record = make_record()
                trainer.history.append(record)  # LOOP-APPEND
            else:
                trainer.train_step()
            doctor.step()
    return doctor.summary.to_dict()


def logged_losses(steps: int) -> dict:
    """A torch loop that logs each step's loss tensor through a logger whose MemoryHandler buffers every
    record: the buffer keeps each loss with its graph; the loop's `loss` holds only the newest."""
    import logging
    import logging.handlers

    import torch

    from leakdoctor.callbacks.torch import LeakDoctor

    log = logging.getLogger("leakdoctor-test-buffered")
    log.propagate, log.handlers = False, [logging.handlers.MemoryHandler(capacity=10**9, flushLevel=logging.CRITICAL)]
    log.setLevel(logging.DEBUG)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    with LeakDoctor(model=model, optimizer=optimizer, memory_limit=LIMIT, verbose=False, overhead=1.0) as doctor:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            log.debug("loss %s", loss)  # LOG-LOSS
            doctor.step()
    return doctor.summary.to_dict()


# --- tests --------------------------------------------------------------------------------------------

def test_tensors_kept_by_a_loggers_buffer_are_named_as_its_buffer_at_the_logging_line():
    """Not the loop's `loss` variable, which holds only the newest tensor: the MemoryHandler's buffer,
    reached from the user's logger, at the line that logs the tensor."""
    summary = isolated(logged_losses, 600)
    finding = only(summary, "retained_graph")
    assert place(finding) == f"MemoryHandler.buffer of log in logged_losses() (tests/{at('LOG-LOSS')})"


def test_an_equinox_step_retraced_every_step_is_placed_at_the_users_call():
    summary = isolated(equinox_retraced, 48, LIMIT)
    finding = only(summary, "compile_cache")
    assert finding["metric"] == "rss_bytes"
    assert place(finding).endswith(at("EQX-CALL")) and in_users_file(place(finding)), place(finding)


def test_an_equinox_retrace_on_the_compile_count_names_the_function_at_the_users_call():
    summary = isolated(equinox_retraced, 48, HUGE)
    finding = only(summary, "compile_cache")
    assert finding["metric"] == "jax_compiles"
    # placed as every compile_cache finding is ('file.py:12'); the compiled function is named in the evidence
    assert place(finding).endswith(at("EQX-CALL")) and in_users_file(place(finding)), place(finding)
    assert says(finding["evidence"], "jax_compiled", function="step")


def test_a_flax_nnx_retrace_on_the_compile_count_is_placed_at_the_step_in_the_users_file():
    summary = isolated(nnx_retraced, 48, HUGE)
    finding = only(summary, "compile_cache")
    assert finding["metric"] == "jax_compiles"
    assert place(finding).endswith(at("NNX-STEP")) and in_users_file(place(finding)), place(finding)
    assert says(finding["evidence"], "jax_compiled", function="_train_step")


def test_a_flax_nnx_retrace_on_memory_is_placed_at_the_step_in_the_users_file():
    summary = isolated(nnx_retraced, 48, LIMIT)
    finding = only(summary, "compile_cache")
    assert finding["metric"] == "rss_bytes"
    assert place(finding).endswith(at("NNX-STEP")) and in_users_file(place(finding))


def test_a_watched_objects_growing_list_is_placed_at_the_line_that_appends():
    summary = isolated(watched_trainer, 150, False)
    finding = only(summary, "container_growth")
    assert finding["metric"] == "len(Trainer.history)"
    assert place(finding) == f"Trainer.history (tests/{at('TRAINER-APPEND')})"
    assert says(finding["recommendation"], "list_stores", list="Trainer.history", type="bytearray")


def test_a_list_appended_by_the_loop_is_placed_at_the_loops_append_not_at_the_classs_other_store():
    summary = isolated(watched_trainer, 150, True)
    finding = only(summary, "container_growth")
    assert finding["metric"] == "len(Trainer.history)"
    assert place(finding) == f"Trainer.history (tests/{at('LOOP-APPEND')})"


def test_the_fix_quotes_the_expression_the_code_stores(tmp_path: Path):
    """What a holder's code stores, as the fix texts quote it: the appended call, the name added to a
    running total, an operation in parentheses; the first store of the lines asked."""
    source = tmp_path / "loop.py"
    source.write_text("def loop(model, x, activations, cache, total):\n"
                      "    activations.append(model(x).mean())\n"
                      "    total += loss\n"
                      "    cache[len(cache)] = x * 2\n")
    path = str(source)
    assert stored_value(path, 1, 4, "activations") == "model(x).mean()"
    assert stored_value(path, 1, 4, "total") == "loss"
    assert stored_value(path, 1, 4, "cache") == "(x * 2)"
    assert stored_value(path, 1, 1, "activations") is None  # no store on the lines asked
