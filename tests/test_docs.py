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
