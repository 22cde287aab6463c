"""A new user's first hour on the command line (issue #40) and the options it derives from their one
definition (issue #39): `--version`, a top-level help with examples, the flags of `leakdoctor run` (one per
option), typos answered with the nearest flag or value, a missing script said as such, the plot refused at
construction without matplotlib, the demo free of warnings, the licence and what git ignores."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from procs import ROOT, env, leakdoctor_run, run

from leakdoctor.settings import OPTIONS


def leakdoctor(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "leakdoctor", *args], cwd=cwd)


def pyproject(key: str) -> str:
    """A value of pyproject.toml's [project] (`license = { text = ... }`: the text)."""
    found = re.search(rf'^{key} = (?:{{ text = )?"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found, key
    return found.group(1)


def never_run(tmp_path: Path) -> Path:
    """A script that leaves a file behind if it ever runs."""
    script = tmp_path / "never.py"
    script.write_text("open('ran', 'w').close()\n")
    return script


# --- --version and --help ------------------------------------------------------------------------------

def test_version_says_the_packages_version():
    from leakdoctor import __version__

    result = leakdoctor("--version")
    assert result.returncode == 0 and result.stdout.split() == ["leakdoctor", pyproject("version")]
    assert __version__ == pyproject("version")


def test_the_top_level_help_shows_examples_and_each_command_its_exit_statuses():
    top = leakdoctor("--help")
    assert top.returncode == 0
    examples = top.stdout.split("examples:\n", 1)[1]
    commands = [line.split()[1] for line in examples.splitlines() if line.startswith("  leakdoctor ")]
    assert {"demo", "run", "report"} <= set(commands)
    assert "exit status" not in top.stdout  # each command's own help says it
    for command in ("report", "run"):
        assert "exit status:" in leakdoctor(command, "--help").stdout


# --- the flags of `leakdoctor run`, derived from the options -----------------------------------------------

def run_parser() -> argparse.ArgumentParser:
    from leakdoctor.cli import make_parser

    return make_parser()[1]


def test_every_option_a_command_line_can_give_is_a_flag_of_run():
    flags = {flag: action.dest for action in run_parser()._actions for flag in action.option_strings}
    for option in OPTIONS:
        if option.command_line:
            assert flags[option.flag] == option.name, option.name
            assert all(flags[alias] == option.name for alias in option.flags)
        else:
            assert option.flag not in flags
    assert flags["--summary"] == "summary_path" and flags["--plot"] == "plot_path"  # the short names stay


@pytest.mark.parametrize(("words", "expected"), [
    (["--window", "12"], {"window": 12}),
    (["--memory-limit", "8GiB", "--overhead", "1.0"], {"memory_limit": "8GiB", "overhead": 1.0}),
    (["--verbose", "False", "--heartbeat", "None"], {"verbose": False, "heartbeat": None}),
    (["--remedies", "gc_collect,malloc_trim"], {"remedies": ["gc_collect", "malloc_trim"]}),
    (["--remedies", "safe", "--on-limit", "stop"], {"remedies": "safe", "on_limit": "stop"}),
    (["--summary", "s.json", "--prometheus-host", "0.0.0.0", "--prometheus-port", "0"],
     {"summary_path": "s.json", "prometheus_host": "0.0.0.0", "prometheus_port": 0}),
    (["-o", "window=12", "--sampler", "inline"], {"window": 12, "sampler": "inline"}),
    ([], {}),
])
def test_each_flag_gives_its_option_the_value_the_python_api_would_take(tmp_path, monkeypatch, words, expected):
    from leakdoctor._runner.command import doctor_options

    monkeypatch.chdir(tmp_path)
    args = run_parser().parse_args([*words, "train.py"])
    assert doctor_options(args) == expected


def test_a_flag_given_to_run_reaches_the_doctor(tmp_path):
    summary = tmp_path / "s.json"
    script = tmp_path / "loop.py"
    script.write_text("def train_step():\n"
                      "    return 1\n"
                      "for _ in range(30):\n"
                      "    train_step()\n")
    result = run(leakdoctor_run("--window", "7", "--warmup", "3", "--summary-path", summary, "--step-on", "train_step",
                                script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    import json

    settings = json.loads(summary.read_text())["settings"]
    assert (settings["window"], settings["warmup"]) == (7, 3)


# --- typos get the nearest word -------------------------------------------------------------------------

def test_a_misspelt_flag_of_run_is_refused_with_the_nearest_before_the_script_runs(tmp_path, capsys):
    from leakdoctor.cli import main

    script = never_run(tmp_path)
    assert main(["run", "--remedy", "safe", str(script)]) == 2
    assert "--remedy: did you mean --remedies?" in capsys.readouterr().err
    assert main(["run", "--windw", "3", str(script)]) == 2
    assert "did you mean --window?" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("words", [["--remedies", "safee"], ["-o", "remedies=safee"]])
def test_a_misspelt_remedies_value_names_the_levels_and_the_remedies(tmp_path, capsys, words):
    from leakdoctor import remedies
    from leakdoctor.cli import main

    assert main(["run", *words, str(never_run(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'safe'?" in err
    assert all(repr(name) in err for name in (*remedies.LEVELS, *remedies.NAMES)), err
    assert not (tmp_path / "ran").exists()


def test_a_misspelt_value_with_fixed_choices_gets_the_nearest(tmp_path, capsys):
    from leakdoctor.cli import main

    assert main(["run", "--sampler", "thraed", str(never_run(tmp_path))]) == 2
    assert "did you mean 'thread'?" in capsys.readouterr().err
    assert main(["run", "--on-limit", "stpo", str(never_run(tmp_path))]) == 2
    assert "did you mean 'stop'?" in capsys.readouterr().err


def test_a_misspelt_command_or_flag_elsewhere_gets_the_nearest():
    command = leakdoctor("reprot", "s.json")
    assert command.returncode == 2 and "did you mean report?" in command.stderr
    flag = leakdoctor("report", "--plto", "x.png", "s.json")
    assert flag.returncode == 2 and "did you mean --plot?" in flag.stderr
    case = leakdoctor("demo", "--case", "torch_hooks")
    assert case.returncode == 2 and "did you mean 'torch-hooks'?" in case.stderr


# --- run without a script -------------------------------------------------------------------------------

@pytest.mark.parametrize("words", [[], ["--summary", "s.json"], ["--fail-on-leak"]])
def test_run_without_a_script_says_a_script_is_needed(words):
    result = leakdoctor("run", *words)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: leakdoctor run [options] script.py [args...]")
    assert "a script to run is needed" in result.stderr
    assert "required" not in result.stderr


def test_run_help_still_works_without_a_script():
    result = leakdoctor("run", "-h")
    assert result.returncode == 0 and "--memory-limit" in result.stdout


# --- the plot without matplotlib: refused at construction -----------------------------------------------

@pytest.fixture
def no_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import matplotlib (a sitecustomize marks it missing, as an
    interpreter without it would find it): matplotlib's absence, simulated, nothing mocked."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    return env(PYTHONPATH=f"{ROOT}:{site}")


def test_plot_path_without_matplotlib_fails_at_construction_naming_the_extra(tmp_path, no_matplotlib):
    code = ("from leakdoctor import LeakDoctor\n"
            "try:\n"
            "    LeakDoctor(plot_path='p.png', verbose=False)\n"
            "except ValueError as err:\n"
            "    print('refused:', err)\n"
            "import importlib.util; print('importable:', importlib.util.find_spec('matplotlib') is not None)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=no_matplotlib, capture_output=True,
                            text=True, timeout=120)
    assert "importable: False" in result.stdout, result.stderr
    assert "refused: plot_path=" in result.stdout and "leakdoctor[plot]" in result.stdout, result.stdout
    assert not (tmp_path / "p.png").exists()


def test_run_with_plot_without_matplotlib_exits_2_before_the_script_runs(tmp_path, no_matplotlib):
    script = never_run(tmp_path)
    result = subprocess.run([str(c) for c in leakdoctor_run("--plot", "p.png", script)], cwd=tmp_path,
                            env=no_matplotlib, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "leakdoctor[plot]" in result.stderr, result.stderr
    assert not (tmp_path / "ran").exists()


def test_plot_path_with_matplotlib_is_taken(tmp_path):
    pytest.importorskip("matplotlib")
    from leakdoctor.settings import Settings

    assert Settings.create(plot_path=tmp_path / "p.png").plot_path == tmp_path / "p.png"


# --- the demo, the licence, what git ignores ------------------------------------------------------------

@pytest.mark.parametrize("case", ["torch-hooks", "numpy-cycles", "mlx-lazy"])
def test_the_demo_raises_no_warning(tmp_path, case):
    from leakdoctor import demo

    if case not in demo.available():
        pytest.skip(f"{case} needs {demo.CASES[case][1]}")
    result = subprocess.run([sys.executable, "-W", "error", "-m", "leakdoctor", "demo", "--case", case, "--out",
                             str(tmp_path)], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert result.returncode in (0, 1), result.stderr  # 1: the demo's verdict is leak (not its code's fault)
    assert not re.search(r"\w*Warning\b", result.stderr), result.stderr
    assert (tmp_path / "leakdoctor-demo.json").exists()


def test_the_licence_file_is_the_one_pyproject_names():
    licence = pyproject("license")
    text = (ROOT / "LICENSE").read_text()
    assert licence == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_git_ignores_the_demos_outputs():
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    for name in ("leakdoctor-demo.json", "leakdoctor-demo.png"):
        assert subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", name]).returncode == 0, name
