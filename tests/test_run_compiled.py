"""`leakdoctor run` on scripts whose step is compiled or jitted (mx.compile, jax.jit, equinox.filter_jit,
flax.nnx.jit), found without flags: a step is each outermost call of the step function, never a trace
of the update inside it; a script without a recognisable step ends "unwatched", not clean; and force_eval
under `--step-on mlx.core:eval` evaluates with MLX's own eval, not through the step wrapper.

Each script runs in its own process (tests/scripts/), as in test_run.py; `-o overhead=1.0` samples every
step, since these tests are about counting steps."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import counts, says, place
from procs import SCRIPTS, leakdoctor_run, run

COUNT = ("-o", "overhead=1.0")
FAST = ("-o", "overhead=1.0", "-o", "memory_limit=4GiB")


def line_of(script: str, marker: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"# {marker}" in line)


def leak_run(tmp_path, script: str, *args: str, options=COUNT) -> tuple[dict, object]:
    """Run a script under `leakdoctor run --summary`; the summary and the completed process."""
    path = tmp_path / "leaks.json"
    result = run(leakdoctor_run(*options, "--summary", path, SCRIPTS / script, *args), cwd=tmp_path)
    assert path.exists(), f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return json.loads(path.read_text()), result


def test_an_mlx_step_compiled_like_mnist_counts_each_call_not_the_traces(tmp_path):
    pytest.importorskip("mlx.core")
    summary, result = leak_run(tmp_path, "mlx_compiled.py", "300", options=COUNT)
    assert result.returncode == 0 and result.stdout == "trained 300 steps\n", result.stderr
    assert summary["framework"] == "mlx" and summary["steps"] == 300  # not 2 (the traces of optimizer.update)
    assert summary["verdict"] == "clean", summary["findings"]
    assert summary["errors"] == []


def test_an_mlx_compiled_step_never_evaluated_is_a_lazy_graph_at_the_call_of_the_step(tmp_path):
    """The update is inside the compiled step, where mx.eval is not allowed: the place to evaluate the
    state is after the call of the step, which the finding names (not the update inside it)."""
    pytest.importorskip("mlx.core")
    summary, result = leak_run(tmp_path, "mlx_compiled.py", "300", "no-eval", options=FAST)
    assert result.returncode == 0 and result.stdout == "trained 300 steps\n", result.stderr
    lazy = [f for f in summary["findings"] if f["cause"] == "lazy_graph"]
    assert len(lazy) == 1, json.dumps({k: summary[k] for k in ("verdict", "steps", "findings", "notes", "errors")})
    (found,) = lazy
    assert place(found).endswith(f"mlx_compiled.py:{line_of('mlx_compiled.py', 'STEP-CALL')}"), found
    assert (found["state"], found["severity"]) == ("leak", "major") and summary["verdict"] == "leak"


def test_an_mlx_compiled_step_whose_outputs_are_kept_is_a_leak(tmp_path):
    pytest.importorskip("mlx.core")
    summary, result = leak_run(tmp_path, "mlx_compiled.py", "300", "keep", options=FAST)
    assert result.returncode == 0 and result.stdout == "trained 300 steps\n", result.stderr
    assert summary["steps"] == 300
    assert summary["verdict"] == "leak" and any(counts(f) for f in summary["findings"]), summary["findings"]


@pytest.mark.parametrize("kind, module", [("jit", "jax"), ("eqx", "equinox"), ("nnx", "flax.nnx")])
def test_a_jitted_jax_step_counts_once_per_call(tmp_path, kind, module):
    """jit: optax inside the jit, an eval_step jitted and called before training, and a one-off
    `jax.jit(lambda ...)`: none of those is the step, train_step is, from its first call."""
    pytest.importorskip(module)
    summary, result = leak_run(tmp_path, "jax_jitted.py", kind, "120", options=COUNT)
    assert result.returncode == 0 and result.stdout.endswith("trained 120 steps\n"), result.stderr
    assert summary["framework"] == "jax" and summary["steps"] == 120
    assert summary["verdict"] == "clean", summary["findings"]


def test_a_script_without_a_recognisable_step_is_unwatched_not_clean(tmp_path):
    script = tmp_path / "numpy_loop.py"
    script.write_text("import numpy as np\n\nw = np.zeros(8)\nfor i in range(200):\n"
                      "    w = w - 0.1 * (w - np.ones(8))\nprint('done')\n")
    path = tmp_path / "leaks.json"
    result = run(leakdoctor_run("--fail-on-leak", "--summary", path, script), cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr  # unwatched is no failure
    summary = json.loads(path.read_text())
    assert summary["verdict"] == "unwatched" and summary["steps"] == 0 and summary["framework"] == "python"
    assert summary["findings"] == [] and summary["unwatched"]["reason"]
    assert "--step-on module:function" in summary["unwatched"]["fix"]
    assert says(result.stderr, "verdict", verdict="UNWATCHED"), result.stderr
    report = run([sys.executable, "-m", "leakdoctor", "report", path], cwd=tmp_path)
    assert report.returncode == 3, report.stdout + report.stderr


def test_force_eval_under_step_on_mx_eval_uses_mlx_eval_itself(tmp_path):
    """Each return of mx.eval is a step; force_eval's own mx.eval is neither a step nor a recursion."""
    pytest.importorskip("mlx.core")
    summary, result = leak_run(tmp_path, "mlx_eval_batches.py", "200",
                               options=(*FAST, "--step-on", "mlx.core:eval", "--remedies", "safe"))
    assert result.returncode == 0 and result.stdout == "trained 200 steps\n", result.stderr
    assert "RecursionError" not in result.stderr
    assert summary["steps"] == 200  # the script's 200 evaluations, none of the remedy's
    assert summary["errors"] == [], summary["errors"]
    lazy = [f for f in summary["findings"] if f["cause"] == "lazy_graph"]
    assert lazy and lazy[0]["remedy"]["name"] == "force_eval" and lazy[0]["remedy"]["error"] is None, lazy
