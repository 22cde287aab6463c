"""The HTML report (leakdoctor/reporting/_html.py), read back with the standard library's html.parser
(tests/htmldom.py): every field of every finding under its stable attribute, the place taken apart (file,
line, function, holder), the remedy and its outcome, the proving series drawn, the timeline, hostile names
escaped, nothing that could load from elsewhere, a notebook's fragment scoped; then `leakdoctor report
--html`, `leakdoctor run --html` and `html_path=` on real leaking loops, asserted on the page's fields,
and the README example's page in examples/ kept up to date. The browser's view of it is
tests/test_html_browser.py."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import isolated
from htmldom import Page
from procs import SCRIPTS, leakdoctor_run, run

from leakdoctor import Finding, LeakDoctor, Summary
from leakdoctor.cli import main as cli
from leakdoctor.reporting._html import events, fragment, place, render
from leakdoctor.reporting.summary import RemedyOutcome, SeriesSummary
from leakdoctor.settings import Settings

HERE = Path(__file__)
EXAMPLES = HERE.resolve().parent.parent / "examples"
MIB = 2**20


def series(unit: str, trend: str, values: list[float], every: int = 10) -> SeriesSummary:
    points = [(step * every, value) for step, value in enumerate(values)]
    return SeriesSummary(unit, values[0], values[-1], max(values), 1.0, trend, points)


def three_findings() -> Summary:
    """A remedied leak held by a local variable, a hook leak that still grows (shown on its count and on
    resident memory), and a withdrawn suspicion without a place."""
    remedy = RemedyOutcome("gc_collect", applied_step=64, effective=True, rate_after=0.0, detail="gc.collect()")
    remedied = Finding("python_objects", "rss_bytes", 22, 64, 1e6, "bytes", "val_losses in train() (train.py:42)",
                       "rss grew", "stop keeping the losses", remedy=remedy, state="remedied", severity="major")
    hooks = Finding("hook_accumulation", "torch_hooks", 30, 80, 1.0, "count", "model.py:7", "a hook a step",
                    "remove the hook", explains=("torch_hooks", "rss_bytes"), state="leak", severity="major")
    withdrawn = Finding("native_memory", "rss_bytes", 40, 90, 1e4, "bytes", None, "grew", "look",
                        state="withdrawn", reason="stopped by itself")
    return Summary("torch", 400, {
        "rss_bytes": series("bytes", "growing", [300 * MIB + i * MIB for i in range(40)]),
        "torch_hooks": series("count", "growing", list(range(40))),
        "step_seconds": series("seconds", "flat", [0.005] * 40),
    }, [remedied, hooks, withdrawn], settings={"warmup": 20}, version="0.1.0")


def page(summary: Summary) -> Page:
    parsed = Page(render(summary))
    assert parsed.errors == [] and parsed.doctype == "DOCTYPE html"
    return parsed


# --- the fields ------------------------------------------------------------------------------------------

def test_every_finding_has_every_field_under_its_attribute():
    found = page(three_findings())
    assert [(f.attrs["data-cause"], f.attrs["data-state"]) for f in found.findings()] == [
        ("hook_accumulation", "leak"), ("python_objects", "remedied"), ("native_memory", "withdrawn")]
    assert found.root.find(data_field="verdict").text == "leak"
    remedied = found.finding("python_objects")
    assert remedied.attrs["data-finding"] == "0"  # its index in the summary, whatever the order shown
    cause = remedied.find(data_field="cause")
    assert cause.attrs["data-value"] == "python_objects"
    assert {name: remedied.field(name) for name in ("state", "severity", "metric", "first-step", "detected-step",
                                                    "file", "line", "function", "holder", "evidence", "fix")} == {
        "state": "remedied", "severity": "major", "metric": "rss_bytes", "first-step": "22", "detected-step": "64",
        "file": "train.py", "line": "42", "function": "train", "holder": "val_losses", "evidence": "rss grew",
        "fix": "stop keeping the losses"}
    assert float(remedied.find(data_field="rate").attrs["data-value"]) == 1e6
    remedy = remedied.find(data_field="remedy")
    assert remedy.attrs["data-outcome"] == "effective"
    assert (remedy.field("remedy-name"), remedy.field("remedy-step"), remedy.field("outcome")) == (
        "gc_collect", "64", "effective: the growth stopped")
    assert float(remedy.find(data_field="rate-after").attrs["data-value"]) == 0.0


def test_a_finding_without_a_remedy_or_a_place_still_has_every_field():
    found = page(three_findings())
    hooks = found.finding("hook_accumulation")
    assert hooks.find(data_field="remedy").attrs["data-outcome"] == "none"
    assert (hooks.field("file"), hooks.field("line"), hooks.field("function"), hooks.field("holder")) == (
        "model.py", "7", "", "")
    withdrawn = found.finding("native_memory")
    assert [withdrawn.field(k) for k in ("file", "line", "function", "holder")] == ["", "", "", ""]
    assert all("hidden" in withdrawn.find(data_field=k).attrs for k in ("file", "line", "function", "holder"))
    assert withdrawn.field("reason") == "stopped by itself"
    assert withdrawn.field("location") == "unknown"


@pytest.mark.parametrize("location, expected", [
    ("train.py:42", ("train.py", "42", None, None)),
    ("val_losses in train() (train.py:42)", ("train.py", "42", "train", "val_losses")),
    ("LitModel.outputs in Trainer.fit() (/a b/lit.py:9)", ("/a b/lit.py", "9", "Trainer.fit", "LitModel.outputs")),
    ("RecordsDataset.records (data.py:12)", ("data.py", "12", None, "RecordsDataset.records")),
    ("jax.live_arrays('cpu')", (None, None, None, "jax.live_arrays('cpu')")),
    (None, (None, None, None, None)),
    ({"file": "t.py", "line": 3, "function": "step", "holder": None}, ("t.py", "3", "step", None)),
])
def test_the_place_is_taken_apart_from_either_schema(location, expected):
    where = place(location)
    assert (where["file"], where["line"], where["function"], where["holder"]) == expected


def test_a_structured_finding_of_schema_2_is_shown_by_its_record():
    summary = three_findings()
    summary.findings[1].location = {"file": "model.py", "line": 7, "function": "forward", "holder": "model[1]"}
    summary.findings[1].evidence = {"code": "hooks_held", "params": {"count": 40}}
    hooks = page(summary).finding("hook_accumulation")
    assert [hooks.field(k) for k in ("file", "line", "function", "holder")] == ["model.py", "7", "forward", "model[1]"]
    assert "hooks_held" in hooks.field("evidence") and "40" in hooks.field("evidence")


# --- the series and the timeline -----------------------------------------------------------------------

def test_the_series_that_proved_each_finding_are_drawn_inside_it():
    found = page(three_findings())
    hooks = found.finding("hook_accumulation")
    charts = {fig.attrs["data-series"]: fig for fig in hooks.find_all("figure")}
    assert set(charts) == {"torch_hooks", "rss_bytes"}
    line = charts["torch_hooks"].find("polyline")
    assert len(line.attrs["points"].split()) == 40 == int(charts["torch_hooks"].attrs["data-points"])
    marks = {(m.attrs["data-mark"], m.attrs["data-step"])
             for m in charts["torch_hooks"].find_all("line", data_mark=True)}
    assert marks == {("onset", "30"), ("detected", "80")}
    remedied = {m.attrs["data-mark"]: m.attrs["data-step"] for m in found.finding("python_objects").find_all(
        "line", data_mark=True)}
    assert remedied == {"onset": "22", "detected": "64", "remedy": "64"}
    table = found.root.find(data_section="series")
    assert [row.attrs["data-metric"] for row in table.find_all("tr", data_metric=True)] == [
        "rss_bytes", "torch_hooks", "step_seconds"]


def test_the_timeline_has_the_warmup_each_growth_detection_and_remedy_and_the_end():
    summary = three_findings()
    found = page(summary).root.find(data_section="timeline")
    shown = [(li.attrs["data-event"], int(li.attrs["data-step"]), li.attrs.get("data-for-finding"))
             for li in found.find_all("li")]
    assert shown == [("start", 0, None), ("warmup", 20, None), ("onset", 22, "0"), ("onset", 30, "1"),
                     ("onset", 40, "2"), ("detected", 64, "0"), ("remedy", 64, "0"), ("detected", 80, "1"),
                     ("detected", 90, "2"), ("end", 400, None)]
    assert [e[:2] for e in events(summary)] == [(s, e) for e, s, _ in shown]


def test_a_run_stopped_before_the_limit_shows_the_stop_on_its_timeline_and_charts():
    summary = three_findings()
    summary.stopped = {"step": 300, "reason": "projected to reach the limit", "checkpoint": None}
    found = page(summary)
    assert found.root.find(data_field="verdict").text == "leak"
    stop = found.root.find("li", data_event="stopped")
    assert stop.attrs["data-step"] == "300"
    assert found.finding("hook_accumulation").find_all("line", data_mark="stopped")
    assert "STOPPED at step 300" in found.root.find(data_section="ending").text


def test_keras_calls_and_an_imminent_oom_are_on_the_timeline():
    summary = three_findings()
    summary.calls = [{"call": 1, "kind": "fit", "first_step": 1, "last_step": 50},
                     {"call": 2, "kind": "evaluate", "first_step": 51, "last_step": 60}]
    summary.oom = {"step": 390, "imminent": True, "rss_bytes": 7.6 * 2**30, "limit_bytes": 8 * 2**30,
                   "figure": "rss_bytes", "growing": [], "sites": []}
    found = page(summary)
    timeline = [(li.attrs["data-event"], li.attrs["data-step"]) for li in found.root.find(
        data_section="timeline").find_all("li") if li.attrs["data-event"] in ("call", "oom")]
    assert timeline == [("call", "50"), ("call", "60"), ("oom", "390")]
    assert "OUT OF MEMORY IMMINENT at step 390" in found.root.find(data_section="ending").text


def test_an_unwatched_run_without_series_or_findings_renders():
    summary = Summary("python", 0, {}, [], unwatched={"reason": "0 step(s) seen", "fix": "name the step"})
    found = page(summary)
    assert found.root.find(data_field="verdict").text == "unwatched"
    assert found.findings() == []
    assert "name the step" in found.root.find(data_section="ending").text
    assert [li.attrs["data-event"] for li in found.root.find(data_section="timeline").find_all("li")] == [
        "start", "end"]


# --- safety and self-containment -------------------------------------------------------------------------

HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'


def hostile_summary() -> Summary:
    summary = three_findings()
    summary.findings[0].location = f"{HOSTILE} in <module>() (</style><b>evil&amp;.py:7)"
    summary.findings[1].evidence = f"</dd></dl></article>{HOSTILE}"
    summary.findings[1].remedy = RemedyOutcome(HOSTILE, 81, effective=False, error=None, detail=HOSTILE)
    summary.series[HOSTILE] = series("count", "growing", [1, 2, 3])
    summary.findings[2].metric = HOSTILE
    summary.findings[2].explains = (HOSTILE,)
    summary.notes.append(f"\x1b[31m{HOSTILE}\x07")
    summary.framework = HOSTILE
    return summary


def test_hostile_file_names_holders_and_metrics_are_text_not_markup():
    source = render(hostile_summary())
    found = page(hostile_summary())
    assert not found.root.find_all("script") and not found.root.find_all("img") and not found.root.find_all("b")
    assert not [n for n in found.root.walk() if any(name.startswith("on") for name in n.attrs)]
    assert "<script" not in source and "\x1b" not in source and "\x07" not in source
    remedied = found.finding("python_objects")
    assert remedied.field("holder") == HOSTILE
    assert remedied.field("function") == "<module>"
    assert remedied.field("file") == "</style><b>evil&amp;.py" and remedied.field("line") == "7"
    hooks = found.finding("hook_accumulation")
    assert hooks.field("evidence") == f"</dd></dl></article>{HOSTILE}"
    assert hooks.field("remedy-name") == HOSTILE
    assert hooks.find(data_field="remedy").attrs["data-outcome"] == "ineffective"
    assert found.finding("native_memory").find("figure").attrs["data-series"] == HOSTILE
    assert found.root.find(data_field="framework").text == HOSTILE
    assert len(found.root.find_all("style")) == 1  # the notes' </style> closed nothing


def test_nothing_in_the_page_can_load_from_elsewhere():
    found = page(three_findings())
    assert not found.root.find_all("script") and not found.root.find_all("link")
    assert not [n for n in found.root.walk() if n.tag in ("img", "iframe", "object", "embed", "audio", "video")]
    assert not [n for n in found.root.walk() if "src" in n.attrs or "srcset" in n.attrs]
    assert all(n.attrs["href"].startswith("#") for n in found.root.find_all("a"))
    policy = found.root.find("meta", http_equiv="Content-Security-Policy").attrs["content"]
    assert "default-src 'none'" in policy
    style = found.root.find("style").text
    assert "url(" not in style and "@import" not in style
    urls = set(re.findall(r"https?://[^\s\"'<>]+", render(three_findings())))
    assert urls <= {"http://www.w3.org/2000/svg"}  # the SVG namespace, a name, never fetched


def test_a_summary_displays_in_a_notebook_as_its_report_scoped_to_itself():
    summary = three_findings()
    shown = summary._repr_html_()
    assert shown == fragment(summary) and not re.search(r"<(html|head|body)[\s>]", shown)
    found = Page(shown)
    assert found.errors == [] and len(found.findings()) == 3
    style = found.root.find("style").text
    selectors = [s.strip() for block in re.findall(r"([^{}]+)\{", style) for s in block.split(",")]
    assert selectors and all(s.startswith(".leakdoctor-report") for s in selectors), selectors
    other = Summary.from_dict(summary.to_dict())
    other.steps = 401
    ids = {Page(fragment(s)).root.find(data_report="leakdoctor").attrs["id"] for s in (summary, other)}
    assert len(ids) == 2  # two reports in one notebook keep their own anchors


# --- the command line and the option -------------------------------------------------------------------

def test_leakdoctor_report_writes_the_page_and_exits_by_the_verdict(tmp_path, capsys):
    summary = three_findings()
    summary.write(tmp_path / "s.json")
    out = tmp_path / "report.html"
    assert cli(["report", str(tmp_path / "s.json"), "--html", str(out)]) == 1  # a leak
    assert f"HTML report written to {out}" in capsys.readouterr().out
    found = page(Summary.load(tmp_path / "s.json"))
    assert Page(out.read_text()).root.find(data_field="verdict").text == "leak"
    assert len(found.findings()) == 3
    assert cli(["report", str(tmp_path / "s.json"), "--html", str(tmp_path)]) == 2  # a folder: one line, exit 2
    assert "cannot write" in capsys.readouterr().err


def test_html_path_is_checked_at_construction(tmp_path):
    assert Settings.create(html_path=tmp_path / "r.html").html_path == tmp_path / "r.html"
    with pytest.raises(ValueError, match="html_path"):
        Settings.create(html_path=tmp_path)
    with pytest.raises(ValueError, match="html_path"):
        LeakDoctor(html_path=3)


def train_leaking_list(folder: str, steps: int = 300) -> str:
    """A numpy MLP that keeps an array a step in a list, under a doctor asked for the HTML page."""
    from leakdoctor.examples.numpy_cycles import MLP

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256))
    y = x[:, :10].argmax(axis=1)
    model, kept = MLP(), []
    with LeakDoctor(verbose=False, html_path=Path(folder) / "report.html",
                    summary_path=Path(folder) / "leaks.json") as doctor:
        for _ in range(steps):
            model.step(x, y)
            kept.append(np.ones(25_000))  # LEAK-HTML
            doctor.step()
    return folder


def test_html_path_writes_the_page_of_a_real_leaking_loop(tmp_path):
    isolated(train_leaking_list, str(tmp_path))
    summary = json.loads((tmp_path / "leaks.json").read_text())
    found = Page((tmp_path / "report.html").read_text())
    assert found.errors == []
    assert found.root.find(data_field="verdict").text == summary["verdict"] == "leak"
    leak = next(f for f in found.findings() if f.attrs["data-state"] == "leak")
    assert leak.field("cause").startswith("python_objects") and leak.attrs["data-cause"] == "python_objects"
    assert leak.field("state") == "leak"
    assert leak.field("file").endswith(HERE.name)
    line = next(i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.endswith("# LEAK-HTML"))
    assert leak.field("line") == str(line)
    assert "rss_bytes" in {fig.attrs["data-series"] for fig in leak.find_all("figure")}


def test_leakdoctor_run_html_writes_the_page_of_a_plain_script(tmp_path):
    out = tmp_path / "report.html"
    result = run(leakdoctor_run("-o", "overhead=1.0", "-o", "memory_limit=4GiB", "--step-on", "train_step",
                                "--summary", tmp_path / "leaks.json", "--html", out, SCRIPTS / "plain_step.py"),
                 cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    found = Page(out.read_text())
    assert found.errors == []
    leak = found.finding("python_objects")
    assert leak.field("state") == "leak" and leak.field("file").endswith("plain_step.py")
    kept = next(i for i, text in enumerate((SCRIPTS / "plain_step.py").read_text().splitlines(), 1) if "# KEPT" in text)
    assert leak.field("line") == str(kept)
    assert found.root.find(data_field="steps").text == "150"


# --- the README example's page -----------------------------------------------------------------------------

def test_the_example_page_in_examples_is_the_one_rendered_from_its_summary():
    """examples/report.html is the demo's summary (examples/report.json) as a page; regenerate both with
    `leakdoctor demo --out /tmp/d && cp /tmp/d/leakdoctor-demo.json examples/report.json && leakdoctor report
    examples/report.json --html examples/report.html`."""
    summary = Summary.load(EXAMPLES / "report.json")
    assert (EXAMPLES / "report.html").read_text() == render(summary), "examples/report.html is out of date"
    found = page(summary)
    assert found.findings() and found.root.find(data_field="verdict").text == summary.verdict


@pytest.mark.parametrize("kind", ["torch", "keras"])
def test_leakdoctor_run_html_reaches_a_doctor_or_callback_the_script_made(tmp_path, kind):
    """A script with its own doctor (torch) or its own Keras callback: the run joins it, and its --html
    applies where the script set no html_path, as --summary and --plot do."""
    for module in ("torch", "keras") if kind == "keras" else ("torch",):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}")
    script, args = ("own_doctor.py", ("torch", "100")) if kind == "torch" else ("own_callback.py", ("keras", "60"))
    out = tmp_path / "report.html"
    result = run(leakdoctor_run("-o", "memory_limit=4GiB", "--summary", tmp_path / "leaks.json", "--html", out,
                                SCRIPTS / script, *args), cwd=tmp_path, KERAS_BACKEND="torch")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "leaks.json").read_text())
    found = Page(out.read_text())
    assert found.errors == [] and found.root.find(data_field="verdict").text == summary["verdict"]
    assert found.root.find(data_field="framework").text == kind
    assert sorted((f.attrs["data-cause"], f.attrs["data-state"]) for f in found.findings()) == sorted(
        (f["cause"], f["state"]) for f in summary["findings"])
