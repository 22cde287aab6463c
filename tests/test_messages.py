"""The message catalogue (leakdoctor/_base/messages.py): records render to text, locations to their one
text, a summary of the old schema is still read; and no test reads the catalogue's words: tests assert on
records' codes and params (helpers.has, helpers.says on records), never on how a message is worded."""

from __future__ import annotations

import ast
import json
import re
import shutil
import string
from pathlib import Path

import pytest

from helpers import has, mentions, place
from leakdoctor._base.messages import (MESSAGES, codes, find, legacy, location, location_text, msg, parse_location,
                                      render, unique)
from leakdoctor._base.schema import OLD_SCHEMAS, SCHEMA
from leakdoctor.reporting.summary import Finding, Summary

TESTS = Path(__file__).parent
PACKAGE = TESTS.parent / "leakdoctor"
OLD_SUMMARY = TESTS / "data" / "summary_v1.json"


def fragments(template: str, words: int = 4) -> list[str]:
    """The literal runs of a template that hold at least `words` words (what a test matching prose would
    copy), stripped of the punctuation at their ends."""
    found = []
    for literal, *_ in string.Formatter().parse(template):
        text = literal.strip(" ;:,.()`'\"")
        if len(text.split()) >= words:
            found.append(text)
    return found


def strings(path: Path) -> list[str]:
    """The string literals of a Python file (those of f-strings too), its docstrings left out: what a test
    could match text with (its comments and docstrings may speak of what a message says)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_test_reads_the_catalogues_words():
    """A test that matched a message's wording would break on a rewording and prove nothing a record's
    code and params do not: no test file (but this one, the catalogue's own) holds a phrase of 4 words or
    more of any template in its strings."""
    # a phrase the library also prints outside the catalogue (the summary's layout: "of the memory limit" in
    # its OUT OF MEMORY line) is the layout's as much as the catalogue's: not looked for
    printed = " ".join(" ".join(" ".join(strings(path)) for path in sorted(PACKAGE.rglob("*.py"))
                                if path.name != "messages.py").split())
    phrases = {fragment: code for code, template in MESSAGES.items() for fragment in fragments(template)
               if fragment not in printed}
    assert len(phrases) > 100  # the catalogue says a lot: the grep below looks for something
    hits = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        text = " ".join(" ".join(strings(path)).split())  # a phrase split over lines is found too
        hits += [f"{path.name}: {code}: {fragment!r}" for fragment, code in phrases.items() if fragment in text]
    assert hits == [], "\n".join(hits)


def test_every_template_names_its_params_and_renders():
    """Each template parses, and renders with its params given (numbers for the unit specs, lists for
    the row specs), as the library renders it."""
    for code, template in MESSAGES.items():
        names = {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}
        assert all(re.fullmatch(r"[a-z_]+", name) for name in names), (code, names)
        assert re.fullmatch(r"[a-z_]+", code), code


def test_records_nest_and_render_in_their_units():
    growth = msg("grew", metric="rss_bytes", growth=3 * 2**20, steps=3, pace=2**20, unit="bytes",
                 trend=msg("trend_rate", rate=4 * 2**20, unit="bytes"))
    record = msg("cleanup_took_back", growth=growth, rung="malloc_trim")
    assert render(record) == ("rss_bytes grew 3.0 MiB in 3 steps (1.0 MiB/step; 4.0 MiB/step over the windows that "
                              "raised the suspicion); malloc_trim took it back, so an allocator was caching freed memory")
    assert codes(record) == ["cleanup_took_back", "grew", "trend_rate"]
    assert find(record, "trend_rate")["params"]["rate"] == 4 * 2**20
    assert render(msg("grew", metric="n", growth=8, steps=8, pace=1.0, unit="count", trend=None)) == \
        "n grew 8 in 8 steps (1/step)"  # None renders as nothing
    assert json.loads(json.dumps(record)) == record  # a record is JSON as it is


def test_unknown_codes_are_refused_when_made_and_said_plainly_when_read():
    with pytest.raises(KeyError):
        msg("no_such_message")
    # a newer file's message, or params this version's template does not have: said as data, never a crash
    assert render({"code": "from_the_future", "params": {"x": 1}}) == 'from_the_future: {"x": 1}'
    assert render({"code": "grew", "params": {}}).startswith("grew: ")
    assert render(legacy("old prose")) == "old prose" and render("old prose") == "old prose"


def test_the_same_note_twice_is_kept_once():
    note = msg("ended", error="ValueError", step=3)
    assert unique([note, dict(note), msg("ended", error="ValueError", step=4)]) == [
        note, msg("ended", error="ValueError", step=4)]


@pytest.mark.parametrize(("text", "fields"), [
    ("train.py:42", location("train.py", 42)),
    ("tests/test_torch.py:128", location("tests/test_torch.py", 128)),
    ("val_losses in train() (train.py:42)", location("train.py", 42, "train", "val_losses")),
    ("global LOSSES (memhandler.py:18)", location("memhandler.py", 18, None, "global LOSSES")),
    ("RecordsDataset.records (data.py:12)", location("data.py", 12, None, "RecordsDataset.records")),
    ("epoch_total in one_epoch() (tests/test_torch.py:235)", location("tests/test_torch.py", 235, "one_epoch",
                                                                      "epoch_total")),
    ("kept in f.<locals>.g() (a.py:3)", location("a.py", 3, "f.<locals>.g", "kept")),
    ("jax.live_arrays('cpu')", location(holder="jax.live_arrays('cpu')")),
    ("fit() at train.py:12, each model replacing the last",
     location(holder="fit() at train.py:12, each model replacing the last")),
])
def test_a_location_is_file_line_function_and_holder_with_one_text(text, fields):
    """The forensics' three ways of naming a place read as one object, and its text is what they said."""
    assert parse_location(text) == fields
    assert location_text(fields) == text
    finding = Finding("python_objects", "rss_bytes", 1, 2, 1.0, "bytes", text, msg("step_keeps"), msg("step_keeps"))
    assert finding.location == fields and finding.where == text and finding.key[2] == text


def test_a_summary_carries_records_and_a_location_object(tmp_path):
    finding = Finding("container_growth", "len(history)", 1, 20, 1.0, "count", "history in train() (train.py:7)",
                      evidence=msg("container_grew", growth=msg("grew", metric="len(history)", growth=20, steps=20,
                                                                 pace=1.0, unit="count", trend=None),
                                   items=msg("new_items", size=2**20), step_time=None, allocated=None),
                      recommendation=msg("bound_or_clear", stores=None, holder="history"))
    summary = Summary("python", 40, {}, [finding], notes=[msg("ended", error="ValueError", step=40)])
    summary.write(tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["schema"] == SCHEMA == "leakdoctor.summary/2"
    (written,) = data["findings"]
    assert written["location"] == {"file": "train.py", "line": 7, "function": "train", "holder": "history"}
    assert has(written["evidence"], "new_items", size="1.0 MiB") and has(written["evidence"], "grew", steps=20)
    assert written["recommendation"] == {"code": "bound_or_clear", "params": {"stores": None, "holder": "history"}}
    assert has(data["notes"], "ended", error="ValueError", step=40)
    loaded = Summary.load(tmp_path / "s.json")
    assert loaded.to_dict() == summary.to_dict()
    text = loaded.text()
    assert f"where: {finding.where}" in text and f"evidence: {render(finding.evidence)}" in text
    assert f"fix: {render(finding.recommendation)}" in text and f"note: {render(summary.notes[0])}" in text


def test_a_summary_of_the_old_schema_is_read_and_reported(tmp_path, capsys):
    """A file of schema 1 (text evidence, recommendation and notes, a location string; written by the
    previous round's doctor): Summary.load reads it, its location as an object, its text as `text` records
    that render as written, and `leakdoctor report` prints it and exits as its verdict says."""
    from leakdoctor.cli import main

    old = json.loads(OLD_SUMMARY.read_text())
    assert old["schema"] in OLD_SCHEMAS and isinstance(old["findings"][0]["evidence"], str)
    summary = Summary.load(OLD_SUMMARY)
    (finding,) = summary.findings
    assert (finding.cause, finding.state, finding.severity) == ("hook_accumulation", "leak", "major")
    assert finding.location == location("benchmarks/plots.py", 33)
    assert finding.evidence == legacy(old["findings"][0]["evidence"]) and finding.evidence_text == \
        old["findings"][0]["evidence"]
    assert [render(n) for n in summary.notes] == old["notes"] and summary.verdict == "leak"
    path = tmp_path / "old.json"
    shutil.copy(OLD_SUMMARY, path)
    assert main(["report", str(path)]) == 1  # a leak
    out = capsys.readouterr().out
    assert f"where: {old['findings'][0]['location']}" in out and old["findings"][0]["evidence"] in out
    assert f"note: {old['notes'][0]}" in out
    # written again, it is a summary of the new schema: records and a location object
    summary.write(tmp_path / "new.json")
    data = json.loads((tmp_path / "new.json").read_text())
    assert data["schema"] == SCHEMA and data["findings"][0]["location"]["line"] == 33
    assert place(data["findings"][0]) == old["findings"][0]["location"]
    assert mentions(data["findings"][0]["evidence"], "63 forward hooks")


def test_every_fact_the_tests_name_is_a_message_of_the_catalogue():
    """helpers.RECORDS names the catalogue's codes that say each fact a test asserts: none is a code the
    catalogue does not have (a renamed code fails here, not as a test that finds nothing)."""
    from helpers import RECORDS

    unknown = {key: [c for c in found if c not in MESSAGES] for key, (found, _) in RECORDS.items()}
    assert {key: c for key, c in unknown.items() if c} == {}
