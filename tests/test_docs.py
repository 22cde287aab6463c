"""The documentation as a house: a README a newcomer reads in minutes (at most 15 kB), the rest a site in
docs/ that MkDocs builds with warnings as errors (every nav page there, every link and anchor found), and
the options page the one generated from the option list."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_BYTES = 15_000


def generator():
    """docs/gen_options.py, loaded as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("gen_options", DOCS / "gen_options.py")
    module = importlib.util.module_from_spec(spec)
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no docs/__pycache__ in the checkout
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = before
    return module


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav names (read as text: the nav is a list of `Title: page.md`)."""
    return re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)


def test_the_readme_is_at_most_15_kb():
    assert (ROOT / "README.md").stat().st_size <= README_MAX_BYTES


def test_the_readme_links_to_docs_pages_that_exist():
    links = re.findall(r"\]\((docs/[^)#]+)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert links, "the README links to the docs"
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_options_page_is_the_generated_one():
    """docs/options.md is what docs/gen_options.py writes from leakdoctor.settings.OPTIONS, word for word:
    after changing an option, run `python docs/gen_options.py`."""
    assert (DOCS / "options.md").read_text(encoding="utf-8") == generator().page()


def test_every_page_is_in_the_nav_and_every_nav_page_exists():
    pages = nav_pages()
    assert len(pages) == len(set(pages))
    assert sorted(set(pages) - {p.name for p in DOCS.glob("*.md")}) == []
    assert sorted({p.name for p in DOCS.glob("*.md")} - set(pages)) == []


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed here (it is in requirements-dev.lock)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "options" / "index.html").is_file()


# --- BENCHMARKS.md: the results first, one table per area, the method below ---------------------------

def assembler():
    """benchmarks/run.py, loaded as a module (the benchmarks are scripts, not part of the package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
        module = importlib.util.module_from_spec(spec)
        before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        finally:
            sys.dont_write_bytecode = before
            del sys.modules[spec.name]
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def without_machine(text: str) -> str:
    """The text less the line that names the machine assembling it (the figures are the results')."""
    return re.sub(r"Last run on: [^\n]*", "Last run on: ...", text)


def test_benchmarks_md_is_what_the_assembler_writes_from_the_results():
    """BENCHMARKS.md is assembled from benchmarks/results/ (`python benchmarks/run.py --assemble`)."""
    checked_in = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert without_machine(checked_in) == without_machine(assembler().document())


def cells(markdown: str) -> list[list[str]]:
    """Every table row of `markdown` as its cells (the rules under the headers left out)."""
    return [[c.strip() for c in line.strip()[1:-1].split(" | ")] for line in markdown.splitlines()
            if line.startswith("|") and not re.fullmatch(r"\|[-:| ]+\|", line.strip())]


def test_each_results_table_is_the_sections_own_figures():
    """Every row of a results table is, cell for cell, a row of the table it was taken from in the method
    part below, and every area links to a heading there: the figures are copied, never recomputed."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    results, method = text.split("\n## Results\n", 1)[1].split("\n## Method and full results\n", 1)
    areas = results.split("\n### ")[1:]
    assert len(areas) == len(assembler().AREAS) and "\n### " in method
    method_rows = cells(method)
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", text, re.M)}
    for area in areas:
        rows = cells(area)
        header, body = rows[0], rows[1:]
        source = next(r for r in method_rows if set(header) <= set(r) and len(r) >= len(header))
        keep = [source.index(c) for c in header]
        start = method_rows.index(source)
        rows_there = [[r[i] for i in keep] for r in method_rows[start + 1:start + 1 + len(body)]]
        assert body == rows_there, area.splitlines()[0]
        link = re.search(r"Method and full results: \[.*\]\(#([^)]+)\)", area).group(1)
        assert re.sub(r"-\d+$", "", link) in anchors, link
    assert "issue #" not in text, "history is in CHANGELOG.md, not in BENCHMARKS.md"
