"""The summary: the contract's JSON schema, a lossless round trip, the text table, an atomic write, the
PNG plot, and the `leakdoctor report` and `leakdoctor demo` commands."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from leakdoctor import Finding, Summary
from leakdoctor.cli import main
from leakdoctor.summary import SCHEMA, RemedyOutcome, SeriesSummary


def sample_summary(verdict_effective: bool | None = True) -> Summary:
    remedy = RemedyOutcome("gc_collect", applied_step=64, effective=verdict_effective, rate_after=12.0)
    finding = Finding("python_objects", "rss_bytes", first_step=22, detected_step=64, rate_per_step=1.0e6,
                      unit="bytes", location="train.py:42", evidence="rss grew", recommendation="fix it",
                      reclaimed_by="gc_collect", remedy=remedy)
    series = {"rss_bytes": SeriesSummary("bytes", 80e6, 62e6, 117e6, 50.0, "plateau",
                                         [(1, 60e6), (30, 90e6), (64, 117e6), (65, 62e6), (400, 62e6)])}
    return Summary("python", 400, series, [finding], overhead={"probe_seconds": 0.01, "fraction_of_step_time": 0.003},
                   notes=["a note"], settings={"warmup": 20}, version="0.1.0")


def test_json_has_the_contract_fields():
    data = json.loads(sample_summary().to_json())
    assert data["schema"] == SCHEMA == "leakdoctor.summary/1"
    assert {"framework", "steps", "verdict", "series", "findings", "projected_limit_step", "overhead",
            "ranks"} <= set(data)
    assert set(data["series"]["rss_bytes"]) >= {"start", "end", "peak", "slope_per_step", "trend"}
    finding = data["findings"][0]
    assert set(finding) >= {"cause", "metric", "first_step", "rate_per_step", "unit", "location", "evidence",
                            "recommendation", "remedy"}
    assert set(finding["remedy"]) >= {"name", "applied_step", "effective", "rate_after"}
    assert data["verdict"] == "remedied"


def test_verdicts():
    assert sample_summary(True).verdict == "remedied"
    assert sample_summary(False).verdict == "leak"
    assert sample_summary(None).verdict == "leak"
    benign = sample_summary()
    benign.findings[0].benign = True
    assert benign.verdict == "clean"


def test_round_trip_and_atomic_write(tmp_path):
    summary = sample_summary()
    path = tmp_path / "leaks.json"
    summary.write(path)
    assert [p.name for p in tmp_path.iterdir()] == ["leaks.json"]  # no temporary left behind
    loaded = Summary.load(path)
    assert loaded.to_dict() == summary.to_dict()
    with pytest.raises(ValueError, match="not a leakdoctor summary"):
        Summary.from_dict({"schema": "something/2"})


def test_unknown_cause_is_refused():
    with pytest.raises(ValueError, match="unknown cause 'gremlins'"):
        Finding("gremlins", "rss_bytes", 1, 2, 1.0, "bytes", None, "", "")


def test_text_table():
    text = sample_summary().text()
    assert "verdict REMEDIED" in text
    assert "[LEAK] python_objects on rss_bytes: 976.6 KiB/step since step 22" in text
    assert "where: train.py:42" in text and "gc_collect at step 64, effective" in text


def test_plot_is_a_png(tmp_path):
    path = tmp_path / "leaks.png"
    sample_summary().plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_command(tmp_path, capsys):
    path = tmp_path / "leaks.json"
    sample_summary(False).write(path)
    assert main(["report", str(path), "--plot", str(tmp_path / "p.png")]) == 1  # a leak: exit 1 for CI
    assert "verdict LEAK" in capsys.readouterr().out and (tmp_path / "p.png").exists()
    sample_summary(True).write(path)
    assert main(["report", str(path)]) == 0
    assert main(["report", str(tmp_path / "missing.json")]) == 2


def run_demo(case: str, out: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "leakdoctor.cli", "demo", "--case", case, "--out", out],
                          capture_output=True, text=True, timeout=600)
    return {"rc": proc.returncode, "stderr": proc.stderr}


@pytest.mark.parametrize(("case", "remedy", "example"), [
    ("mlx-lazy", "force_eval", "mlx_lazy.py"),
    ("torch-hooks", "remove_hooks", "torch_hooks.py"),
    ("numpy-cycles", "gc_collect", "numpy_cycles.py"),
])
def test_demo_finds_remedies_and_verifies(tmp_path, case, remedy, example):
    result = run_demo(case, str(tmp_path))
    assert result["rc"] == 0, result["stderr"]
    data = json.loads((tmp_path / "leakdoctor-demo.json").read_text())
    assert data["verdict"] == "remedied"
    leaks = [f for f in data["findings"] if not f["benign"]]
    assert len(leaks) == 1, data["findings"]
    (finding,) = leaks
    assert finding["remedy"]["name"] == remedy and finding["remedy"]["effective"]
    assert example in finding["location"]
    assert (tmp_path / "leakdoctor-demo.png").exists()
    assert f"applied {remedy}" in result["stderr"] and "verdict REMEDIED" in result["stderr"]


def test_demo_default_is_the_first_installed_case():
    from leakdoctor import demo

    assert demo.available()[0] == "mlx-lazy"  # every framework is installed in the dev set
    assert main(["demo", "--case", "nonesuch"]) == 2


def test_the_rate_after_an_effective_remedy_is_refit_over_the_rest_of_the_run():
    """Verification reads a few windows after the remedy, where a flat series quantized to whole MiB can
    show a slope of most of a MiB a step; the summary's rate after is the slope of all that was read
    after the remedy, which for that series is far smaller."""
    from leakdoctor.integrations import MetricSpec
    from leakdoctor.monitor import Monitor
    from leakdoctor.report import final_findings
    from leakdoctor.settings import Settings

    mib = 2.0**20
    settings = Settings.create(verbose=False)
    monitor = Monitor(settings)
    spec = MetricSpec("rss_bytes", "bytes")
    for step in range(1, 401):  # grows 1 MiB a step until the remedy at 60, then 400 MiB give or take one
        value = 340 * mib + step * mib if step <= 60 else (400 + (step // 7) % 2 - (step % 13 == 0)) * mib
        monitor.record(step, {"rss_bytes": value}, lambda name: spec)
    remedy = RemedyOutcome("gc_collect", applied_step=60, effective=True, rate_after=0.7 * mib)
    finding = Finding("python_objects", "rss_bytes", first_step=21, detected_step=50, rate_per_step=mib,
                      unit="bytes", location=None, evidence="rss grew", recommendation="fix it", remedy=remedy)
    [final], _ = final_findings([finding], monitor, settings)
    assert abs(final.remedy.rate_after) < 0.01 * mib, final.remedy
    assert final.rate_per_step == mib and remedy.rate_after == 0.7 * mib  # the finding itself is untouched
