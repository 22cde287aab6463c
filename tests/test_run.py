"""`leakdoctor run` on real, unedited scripts (tests/scripts/), each in its own process: the leak found at
each framework's natural step, the script run exactly as `python script.py` runs it (output, exit
status, traceback, imports), SIGTERM and Ctrl-C mid-run, --step-on, --fail-on-leak and bad options.

Options shared by the leak tests: `-o overhead=1.0` samples every step (these tests are about where the
doctor attaches and what it names, not about pacing), and a memory limit fixes materiality whatever the
machine's RAM."""

from __future__ import annotations

import json
import re
import signal
import sys

import pytest
from leakdoctor._base.schema import SCHEMA
from helpers import counts, phrase, says, place
from procs import SCRIPTS, Watched, leakdoctor_run, run

FAST = ("-o", "overhead=1.0", "-o", "memory_limit=4GiB")
#: Small windows for JAX loops, where each leaking step compiles (a fraction of a second).
JAX_FAST = ("-o", "warmup=10", "-o", "window=4", "-o", "investigate_steps=4", "-o", "memory_limit=4GiB")


def line_of(script: str, marker: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"# {marker}" in line)


def finding(summary: dict, cause: str) -> dict:
    found = [f for f in summary["findings"] if f["cause"] == cause and counts(f)]
    assert found, f"no {cause}: {[(f['cause'], f['metric'], f['state'], f['reason'], f['rate_per_step']) for f in summary['findings']]}; notes {summary['notes']}"
    return found[0]


def leak_run(tmp_path, script: str, *args: str, options=FAST, **env: str) -> tuple[dict, object]:
    """Run a script under `leakdoctor run --summary`; the summary and the completed process."""
    path = tmp_path / "leaks.json"
    result = run(leakdoctor_run(*options, "--summary", path, SCRIPTS / script, *args), cwd=tmp_path, **env)
    assert path.exists(), f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return json.loads(path.read_text()), result


# --- leaks found where each framework steps ------------------------------------------------------------

def test_torch_hooks_registered_every_step_are_found_at_the_optimizer_step(tmp_path):
    summary, result = leak_run(tmp_path, "torch_hooks.py", "150", options=(*FAST, "--fail-on-leak"))
    assert result.stdout.startswith("trained 150 steps, loss ")
    assert result.returncode == 1, result.stderr  # the script succeeded; --fail-on-leak turns a leak into 1
    assert summary["framework"] == "torch" and summary["steps"] == 150 and summary["verdict"] == "leak"
    found = finding(summary, "hook_accumulation")
    assert place(found).endswith(f"torch_hooks.py:{line_of('torch_hooks.py', 'HOOK')}"), found
    # the model was found from the optimizer's parameters
    assert says(found["evidence"], "hooks_held", kind="forward hook"), found["evidence"]
    assert says(result.stderr, "finding_line", state="LEAK", cause="hook_accumulation", metric="torch_hooks")


def test_a_torch_loop_that_also_jits_gets_the_jax_integration_too(tmp_path):
    """One judgement everywhere (issue #38): the run's torch doctor loads the integrations of the other
    frameworks the script imported, as the pytest plugin's does, so a compile a step is named beside the
    hooks, each at its own line."""
    pytest.importorskip("jax")
    summary, _ = leak_run(tmp_path, "torch_hooks_and_jit.py", "120", options=JAX_FAST)
    assert summary["framework"] == "torch" and summary["verdict"] == "leak"
    hooks, compiles = finding(summary, "hook_accumulation"), finding(summary, "compile_cache")
    assert place(hooks).endswith(f"torch_hooks_and_jit.py:{line_of('torch_hooks_and_jit.py', 'HOOK')}")
    assert place(compiles).endswith(f"torch_hooks_and_jit.py:{line_of('torch_hooks_and_jit.py', 'COMPILE')}")


def test_lightning_outputs_kept_are_found_and_sigterm_is_left_to_lightning(tmp_path):
    """Lightning owns SIGTERM during fit (a SIGTERMException at the next step): the run ends its way, and
    the callback's summary holds the finding and the exception."""
    path = tmp_path / "leaks.json"
    watched = Watched(leakdoctor_run(*FAST, "--summary", path, SCRIPTS / "lightning_outputs.py", "100000"),
                      cwd=tmp_path)
    watched.wait_for("retained_graph on len(Leaky.outputs)", stream="err", timeout=150)
    watched.process.send_signal(signal.SIGTERM)
    status = watched.finish()
    assert status == 0, watched.stderr  # Lightning's SIGTERMException is a SystemExit without a code
    summary = json.loads(path.read_text())
    assert summary["framework"] == "lightning" and summary["verdict"] == "leak"
    found = finding(summary, "retained_graph")
    assert found["metric"] == "len(Leaky.outputs)"
    assert place(found).endswith(f"lightning_outputs.py:{line_of('lightning_outputs.py', 'KEPT')})"), found
    assert says(summary["notes"], "ended", error="SIGTERMException"), summary["notes"]


def test_lightning_ddp_ranks_started_by_lightning_run_under_the_doctor_too(tmp_path):
    """Lightning starts rank 1 as a subprocess running the script; it runs under `leakdoctor run` with the
    same options, so rank 0's callback gathers both ranks (without rank 1's callback it would wait forever)."""
    summary, result = leak_run(tmp_path, "lightning_outputs.py", "100", "2")
    assert result.returncode == 0 and "rank 0 trained 100 steps" in result.stdout, result.stderr
    assert [(r["rank"], r["verdict"]) for r in summary["ranks"]] == [(0, "leak"), (1, "leak")], summary["ranks"]
    assert all(f["cause"] == "retained_graph" for r in summary["ranks"] for f in r["findings"])


def test_keras_models_built_in_a_loop_are_found_across_fit_calls(tmp_path):
    """40 fits: the investigation's gc.collect() frees the pile of old models, which then piles up again;
    with 20, what piled up after it could be too little for the run's growth to show (1 run in 5 ended
    with the finding withdrawn)."""
    summary, result = leak_run(tmp_path, "keras_models_in_a_loop.py", "40", options=("-o", "memory_limit=4GiB"),
                               KERAS_BACKEND="torch")
    assert result.returncode == 0 and result.stdout == "fitted 40 models\n", result.stderr
    assert summary["framework"] == "keras" and len(summary["calls"]) == 40  # 40 fit calls, marked
    assert summary["steps"] == sum(c["last_step"] - c["first_step"] + 1 for c in summary["calls"])  # their batches
    found = finding(summary, "python_objects")
    line = line_of("keras_models_in_a_loop.py", "FIT-IN-LOOP")
    assert place(found).endswith(f"keras_models_in_a_loop.py:{line}"), found
    assert says(found["recommendation"], "clear_session")


def test_mlx_updates_never_evaluated_are_found_at_optimizer_update(tmp_path):
    pytest.importorskip("mlx.core")
    summary, result = leak_run(tmp_path, "mlx_lazy.py", "200")
    assert result.returncode == 0 and result.stdout == "trained 200 steps\n", result.stderr
    assert summary["framework"] == "mlx" and summary["steps"] == 200
    found = finding(summary, "lazy_graph")
    assert found["metric"] == "rss_bytes"


def test_optax_update_with_an_unjitted_cond_is_found_at_the_update(tmp_path):
    summary, result = leak_run(tmp_path, "optax_radam.py", "45", options=JAX_FAST)
    assert result.returncode == 0 and result.stdout == "trained 45 steps\n", result.stderr
    assert summary["framework"] == "jax" and summary["steps"] == 45  # the outermost update of the chain only
    found = finding(summary, "compile_cache")
    from leakdoctor.examples import old_radam

    cond = next(i for i, line in enumerate(open(old_radam.__file__).read().splitlines(), 1)
                if "lax.cond(" in line and "# RADAM-COND" in line)
    assert place(found).endswith(f"old_radam.py:{cond}"), found
    assert says(found["evidence"], "lax_cond")


@pytest.mark.parametrize("step_on, args, marker", [("train_step", (), "KEPT"),
                                                   ("plain_steps:train_step", ("module",), "KEPT-MODULE")])
def test_step_on_names_the_step_of_a_plain_script(tmp_path, step_on, args, marker):
    summary, result = leak_run(tmp_path, "plain_step.py", *args, options=(*FAST, "--step-on", step_on))
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    assert summary["framework"] == "python" and summary["steps"] == 150
    found = finding(summary, "python_objects")
    script = "plain_steps.py" if args else "plain_step.py"
    assert place(found).endswith(f"{script}:{line_of(script, marker)}"), found  # line numbers unchanged


# --- the script runs as Python runs it ------------------------------------------------------------------

def test_a_clean_script_keeps_its_output_status_and_imports(tmp_path):
    script = SCRIPTS / "clean_torch.py"
    plain = run([sys.executable, script, "a", "--", "-b"], cwd=tmp_path)
    watched = run(leakdoctor_run(script, "a", "--", "-b"), cwd=tmp_path)
    assert plain.returncode == watched.returncode == 3
    assert watched.stdout == plain.stdout  # argv, __name__, sys.path[0], __file__, imports, losses
    assert "imported before the script's own imports: []" in plain.stdout
    assert plain.stderr == ""
    # the summary only
    assert phrase("headline", framework="torch", steps=120, verdict="CLEAN").match(watched.stderr), watched.stderr
    assert not says(watched.stderr, "live_line"), watched.stderr


def test_an_uncaught_exception_prints_the_scripts_traceback_and_the_summary_notes_it(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("def step(i):\n    return i\n\n\ndef train():\n    for i in range(30):\n        step(i)\n"
                      "    raise ValueError('diverged')\n\n\ntrain()\n")
    plain = run([sys.executable, script], cwd=tmp_path)
    watched = run(leakdoctor_run("--step-on", "step", "--summary", tmp_path / "leaks.json", script), cwd=tmp_path)
    assert plain.returncode == watched.returncode == 1
    assert "ValueError: diverged" in plain.stderr
    assert watched.stderr.startswith(plain.stderr), watched.stderr  # the same traceback, then the summary
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["steps"] == 30 and says(summary["notes"], "ended", error="ValueError", step=30), summary["notes"]


def test_sigterm_mid_run_leaves_a_complete_summary(tmp_path):
    path = tmp_path / "leaks.json"
    watched = Watched(leakdoctor_run(*FAST, "--summary", path, SCRIPTS / "torch_hooks.py", "1000000"), cwd=tmp_path)
    watched.wait_for("hook_accumulation on torch_hooks", stream="err")
    watched.process.send_signal(signal.SIGTERM)
    assert watched.finish() == -signal.SIGTERM, watched.stderr
    summary = json.loads(path.read_text())
    assert summary["schema"] == SCHEMA and summary["verdict"] == "leak" and summary["steps"] > 60
    assert finding(summary, "hook_accumulation")["metric"] == "torch_hooks"
    assert summary["series"]["torch_hooks"]["end"] > 60
    assert says(summary["notes"], "ended", error="SIGTERM"), summary["notes"]


def test_ctrl_c_ends_as_python_ends_and_the_summary_is_written(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text("from leakdoctor.examples import numpy_cycles\nimport time\n"
                      "numpy_cycles.run(lambda: None, steps=5)\n"
                      "raise KeyboardInterrupt\n")
    plain = run([sys.executable, script], cwd=tmp_path)
    watched = run(leakdoctor_run("--step-on", "leakdoctor.examples.numpy_cycles:MLP.step", "--summary",
                                 tmp_path / "leaks.json", script), cwd=tmp_path)
    assert plain.returncode == watched.returncode == -signal.SIGINT  # Python re-raises SIGINT to end
    assert watched.stderr.startswith(plain.stderr), watched.stderr
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert summary["steps"] == 5
    assert says(summary["notes"], "ended", error="KeyboardInterrupt", step=5), summary["notes"]


def test_bad_options_fail_before_the_script_runs(tmp_path):
    script = tmp_path / "never.py"
    script.write_text("open('ran', 'w').close()\n")
    for options, message in [(("--remedies", "most"), "remedies"), (("-o", "colour=1"), "-o 'colour=1'"),
                             (("--prometheus-port", "70000"), "prometheus_port"), (("--step-on", "a b"), "--step-on"),
                             (("--prometheus-host", "0.0.0.0"), "prometheus_port")]:
        result = run(leakdoctor_run(*options, script), cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (options, result.stderr)
    assert not (tmp_path / "ran").exists()
    missing = run(leakdoctor_run(tmp_path / "missing.py"), cwd=tmp_path)
    assert missing.returncode == 2 and "can't open file" in missing.stderr


def test_fail_on_leak_takes_its_level_only_after_an_equals_sign():
    from leakdoctor._runner.command import split

    assert split(["run", "--fail-on-leak", "train.py", "--epochs", "3"]) == \
        (["run", "--fail-on-leak", "train.py"], ["--epochs", "3"])
    assert split(["run", "--fail-on-leak=minor", "--summary", "s.json", "train.py"]) == \
        (["run", "--fail-on-leak=minor", "--summary", "s.json", "train.py"], [])


def test_fail_on_leak_right_before_the_script_never_takes_the_script_as_its_level(tmp_path):
    """`leakdoctor run --fail-on-leak train.py` runs train.py (before: argparse took train.py as the level,
    `invalid choice: 'train.py'`, exit 2); `--fail-on-leak=minor` still sets the level, and `leakdoctor report
    --fail-on-leak leaks.json` reads leaks.json."""
    path = tmp_path / "leaks.json"
    leaking = run(leakdoctor_run(*FAST, "--summary", path, "--fail-on-leak", SCRIPTS / "torch_hooks.py", "150"),
                  cwd=tmp_path)
    assert leaking.returncode == 1 and leaking.stdout.startswith("trained 150 steps"), leaking.stderr
    assert json.loads(path.read_text())["verdict"] == "leak"
    report = run([sys.executable, "-m", "leakdoctor", "report", "--fail-on-leak", path], cwd=tmp_path)
    assert report.returncode == 1 and "verdict LEAK" in report.stdout, report.stderr
    clean = run(leakdoctor_run("--fail-on-leak", SCRIPTS / "clean_torch.py", "--fail-on-leak"), cwd=tmp_path)
    assert clean.returncode == 3, clean.stderr  # the script's own status; its argument stays its own
    assert "'--fail-on-leak']" in clean.stdout, clean.stdout
    minor = run(leakdoctor_run("--fail-on-leak=minor", SCRIPTS / "clean_torch.py"), cwd=tmp_path)
    assert minor.returncode == 3, minor.stderr
    level = run(leakdoctor_run("--fail-on-leak", "minor", SCRIPTS / "clean_torch.py"), cwd=tmp_path)
    assert level.returncode == 2 and "--fail-on-leak=minor" in level.stderr, level.stderr


# --- a doctor the script makes itself is joined, never doubled (issue #37, item 3) -------------------------

def summaries_printed(stderr: str) -> int:
    """How many summaries were printed (each begins `leakdoctor: FRAMEWORK, N steps, verdict ...`)."""
    return len(re.findall(r"^leakdoctor: \w+, \d+ steps, verdict ", stderr, re.MULTILINE))


@pytest.mark.parametrize("kind", ["lightning", "keras"])
def test_the_scripts_own_callback_is_joined_with_the_runs_options_where_it_set_none(tmp_path, kind):
    """A script that passes leakdoctor's callback to its Trainer (Lightning) or fit (Keras): the run adds no
    second one (before: Lightning raised "Found more than one stateful callback of type LeakDoctorCallback",
    the script died and the summary said unwatched; Keras printed two summaries); the run's --summary
    applies (the callback set none), the script's plot_path stays (the run's --plot does not replace it)."""
    summary, result = leak_run(tmp_path, "own_callback.py", kind, "120",
                               options=(*FAST, "--plot", tmp_path / "run.png"), KERAS_BACKEND="torch")
    assert result.returncode == 0 and result.stdout.endswith("trained 120 steps\n"), result.stderr
    assert summary["framework"] == kind and summaries_printed(result.stderr) == 1, result.stderr
    assert (tmp_path / "own.png").exists() and not (tmp_path / "run.png").exists()
    if kind == "lightning":
        assert summary["steps"] == 120 and summary["verdict"] == "leak"
        found = finding(summary, "retained_graph")
        assert place(found).endswith(f"lightning_outputs.py:{line_of('lightning_outputs.py', 'KEPT')})"), found


@pytest.mark.parametrize("framework", ["torch", "mlx", "jax"])
def test_a_loop_doctor_the_script_makes_is_the_runs_one_doctor(tmp_path, framework):
    """A loop that makes and steps its own doctor: the run joins it (before: a second doctor at the optimizer
    update or the jitted call, two summaries printed); its summary is written to the run's --summary."""
    pytest.importorskip({"torch": "torch", "mlx": "mlx.core", "jax": "jax"}[framework])
    summary, result = leak_run(tmp_path, "own_doctor.py", framework, "100", options=("-o", "memory_limit=4GiB"))
    assert result.returncode == 0 and result.stdout == "trained 100 steps\n", result.stderr
    assert (summary["framework"], summary["steps"], summary["verdict"]) == (framework, 100, "clean"), summary
    assert summaries_printed(result.stderr) == 1, result.stderr
