"""The real-workload corpus (benchmarks/realworld/, issue #10) as tests: public example training scripts of
the frameworks' authors, each run as a user runs it, in a fresh process, with leakdoctor at its real
defaults (no memory_limit, nothing tuned). A clean script must end clean with no finding at all; its
--leak variant's planted leak must be found with the right cause at the user's line. Every script runs,
with fewer steps than the benchmark; the full corpus, three runs of every clean script, is the
benchmark: `benchmarks/run.py realworld`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import kept

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_realworld  # noqa: E402

#: (script, training steps) of the clean runs: enough for the doctor's warm-up, several investigations
#: and an epoch end (an evaluation spike) in each.
CLEAN = [
    ("torch_mnist", 300),
    ("mlx_mnist", 400),
    ("flax_nnx_mnist", 300),
    ("lightning_autoencoder", 300),
    ("keras_convnet_jax", 300),
    ("flax_linen_mnist", 300),
]
#: (script, training steps) of the --leak runs (None: the script's leak_steps), each found well within them.
LEAKS = [
    ("torch_mnist", 240),
    ("mlx_mnist", 600),
    ("flax_nnx_mnist", 240),
    ("lightning_autoencoder", 240),
    ("keras_convnet_jax", None),
    ("flax_linen_mnist", 100),
]


def show(summary: dict) -> None:
    """Print what a failure needs to be understood (pytest shows a failed test's output in full, where an
    assertion's message is cut): every finding's fields but its texts in full, and the notes."""
    for f in summary["findings"]:
        print({k: v for k, v in f.items() if k not in ("recommendation",)})
    for note in summary["notes"]:
        print("note:", note)


def shown(summary: dict) -> list[str]:
    """The findings as the failure message shows them: what the core fixes need to see."""
    return [f"{f['cause']} on {f['metric']} ({f['rate_per_step']:.3g} {f['unit']}/step) at step "
            f"{f['detected_step']}: {f['evidence']}" for f in summary["findings"]]


@pytest.mark.parametrize("name, steps", CLEAN)
def test_a_clean_public_script_at_the_defaults_ends_clean_with_no_finding(name, steps, tmp_path):
    run = bench_realworld.run_script(name, "default-1", str(tmp_path), steps=steps)
    assert "error" not in run, run["error"]
    summary = run["summary"]
    show(summary)
    assert summary["steps"] >= 1 and summary["errors"] == [], summary["errors"]
    assert kept(summary) == [], (shown(summary), summary["notes"])
    assert summary["verdict"] == "clean"


@pytest.mark.parametrize("name, steps", LEAKS)
def test_the_planted_leak_is_found_with_its_cause_at_the_users_line(name, steps, tmp_path):
    script = bench_realworld.SCRIPTS[name]
    run = bench_realworld.run_script(name, "leak", str(tmp_path), steps=steps)
    assert "error" not in run, run["error"]
    show(run["summary"])
    scored = bench_realworld.score_leak(script, run)
    assert scored["found"], (script.causes, shown(run["summary"]), run["summary"]["notes"])
    assert scored["cause"] in script.causes
    # The location names the file and line where the user planted it (for the old RAdam, its lax.cond).
    assert scored["location_ok"], (scored["location"], script.where)
    assert run["summary"]["verdict"] == "leak"


def test_every_scenario_knows_where_its_leak_is_planted():
    """The truth the corpus scores against: each script marks its planted line(s) with `# LEAK`, names its
    source in its docstring, and attaches the doctor on lines marked `# leakdoctor`."""
    for name, script in bench_realworld.SCRIPTS.items():
        text = script.path.read_text(encoding="utf-8")
        assert bench_realworld.leak_lines(script.path), name
        assert script.source.split()[0] in text.split('"""')[1], name
        assert "# leakdoctor" in text and "memory_limit" not in text, name
