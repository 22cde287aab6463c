"""The HTML report opened in a real headless Chromium through Selenium: the findings' fields read from the
page's DOM (the report of a real torch loop that leaks hooks, run by `leakdoctor run --html`, and the README
example's page in examples/), the charts drawn, hostile names shown as text (no element made of them), and
no request leaving the file: every request the browser's network log records is the file itself (a
control page shows that the log does record an image or a stylesheet the page would fetch).

Skips itself, with the reason, where Selenium, Chromium or chromedriver is not installed (`.ci/run`
installs chromium and chromium-driver with apt where it can)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from procs import SCRIPTS, leakdoctor_run, run

from leakdoctor.reporting._html import render

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)


def _found(names: tuple[str, ...]) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
BROWSER, DRIVER = _found(BROWSERS), _found(DRIVERS)
pytestmark = pytest.mark.skipif(BROWSER is None or DRIVER is None, reason=(
    f"needs Chromium and chromedriver (apt-get install chromium chromium-driver): "
    f"browser {BROWSER or 'not found'}, driver {DRIVER or 'not found'}"))


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1100,1400"):
        options.add_argument(argument)
    options.binary_location = BROWSER
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver, path: Path) -> list[str]:
    """Open `path` and return the URL of every request the browser sent while loading it."""
    driver.get_log("performance")  # drop what earlier pages logged
    driver.get(path.resolve().as_uri())
    driver.execute_script("return document.readyState")
    messages = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    return [m["params"]["request"]["url"] for m in messages if m.get("method") == "Network.requestWillBeSent"]


def fields(driver) -> list[dict[str, str]]:
    """Each finding's attributes and fields as the browser's DOM holds them (textContent: hidden ones too)."""
    return driver.execute_script("""
        return Array.from(document.querySelectorAll('article[data-finding]')).map(a => {
            const out = {index: a.dataset.finding, cause_attr: a.dataset.cause, state_attr: a.dataset.state};
            a.querySelectorAll('[data-field]').forEach(e => {
                if (!(e.dataset.field in out)) out[e.dataset.field] = e.textContent; });
            out.outcome_attr = a.querySelector('[data-field=remedy]').dataset.outcome;
            out.charts = Array.from(a.querySelectorAll('figure[data-series]')).map(f => f.dataset.series);
            return out; });""")


def only_the_file(requests: list[str], path: Path) -> bool:
    return all(url == path.resolve().as_uri() or url.startswith("data:") for url in requests)


def test_the_network_log_records_what_a_page_would_fetch(browser, tmp_path):
    """The control: a page with an image and a stylesheet sends those requests, and the log has them."""
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><img src="missing.png"><link rel="stylesheet" href="style.css">')
    requests = open_page(browser, control)
    assert (tmp_path / "missing.png").as_uri() in requests and (tmp_path / "style.css").as_uri() in requests
    assert not only_the_file(requests, control)


def test_a_real_leak_run_reads_from_the_page_in_a_browser(browser, tmp_path):
    page = tmp_path / "report.html"
    result = run(leakdoctor_run("-o", "overhead=1.0", "-o", "memory_limit=4GiB", "--summary", tmp_path / "leaks.json",
                                "--html", page, SCRIPTS / "torch_hooks.py", "150"), cwd=tmp_path)
    assert page.exists(), f"exit {result.returncode}\n{result.stderr}"
    requests = open_page(browser, page)
    assert requests and only_the_file(requests, page), requests
    assert browser.find_element("css selector", "[data-field=verdict]").text.lower() == "leak"
    found = {f["cause_attr"]: f for f in fields(browser)}
    hooks = found["hook_accumulation"]
    hook_line = next(i for i, text in enumerate((SCRIPTS / "torch_hooks.py").read_text().splitlines(), 1)
                     if "# HOOK" in text)
    assert hooks["state_attr"] == hooks["state"] == "leak"
    assert hooks["cause"].startswith("hook_accumulation")
    assert hooks["file"].endswith("torch_hooks.py") and hooks["line"] == str(hook_line)
    assert hooks["fix"] and hooks["evidence"]
    assert hooks["outcome_attr"] == "none"  # remedies off: none applied
    assert "torch_hooks" in hooks["charts"]
    summary = json.loads((tmp_path / "leaks.json").read_text())
    assert sorted(found) == sorted({f["cause"] for f in summary["findings"]})
    length = browser.execute_script(
        "return document.querySelector('article[data-cause=hook_accumulation] figure polyline').getTotalLength()")
    assert length > 0  # the series is drawn
    assert browser.find_element("css selector", "article[data-cause=hook_accumulation] svg").size["width"] > 100


def test_the_readme_example_page_opens_with_its_finding_and_fetches_nothing(browser):
    page = EXAMPLES / "report.html"
    requests = open_page(browser, page)
    assert requests and only_the_file(requests, page), requests
    summary = json.loads((EXAMPLES / "report.json").read_text())
    shown = fields(browser)
    assert [(f["cause_attr"], f["state"]) for f in shown] == [(f["cause"], f["state"]) for f in summary["findings"]]
    first = summary["findings"][0]
    assert (shown[0]["file"], shown[0]["line"]) == (first["location"]["file"], str(first["location"]["line"]))
    if first["remedy"]:
        assert shown[0]["remedy-name"] == first["remedy"]["name"]
        assert shown[0]["outcome_attr"] == {True: "effective", False: "ineffective", None: "unjudged"}[
            first["remedy"]["effective"]]
    events = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-event]')).map(e => e.dataset.event)")
    assert events[0] == "start" and events[-1] == "end" and "detected" in events
    assert browser.title.startswith("leakdoctor: " + summary["verdict"].upper())


def test_hostile_names_are_shown_as_text_in_the_browser(browser, tmp_path):
    from test_html_report import HOSTILE, hostile_summary

    page = tmp_path / "hostile.html"
    summary = hostile_summary()
    page.write_text(render(summary))
    requests = open_page(browser, page)
    assert only_the_file(requests, page), requests  # the hostile <img src=x> fetched nothing: it is text
    assert browser.execute_script("return document.querySelectorAll('script, img, b').length") == 0
    found = {f["cause_attr"]: f for f in fields(browser)}
    assert found["python_objects"]["holder"] == HOSTILE
    assert found["hook_accumulation"]["remedy-name"] == HOSTILE
    assert browser.title == f"leakdoctor: LEAK ({HOSTILE}, 400 steps)"
