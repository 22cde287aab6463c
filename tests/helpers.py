"""Test helpers. `isolated` runs a scenario in a fresh interpreter: memory readings then start from a
clean heap, so memory freed by an earlier test cannot hide (or fake) the growth a test reproduces."""

from __future__ import annotations

import multiprocessing
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

SCENARIOS = Path(__file__).parent.parent / "benchmarks" / "scenarios"


def _child(conn: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    # as pyproject's filterwarnings: a deprecation raised on a call the library makes is an error (the
    # library's guard then records it in the summary's errors, which the tests read)
    warnings.filterwarnings("error", category=DeprecationWarning, module="leakdoctor")
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException:  # noqa: BLE001 - hand every failure back to the test
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def isolated(fn: Callable[..., Any], *args: Any, timeout: float = 600, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a spawned, non-daemon process (it may start workers of its own); returns
    its (picklable) result or raises with the child's traceback. `fn` must be importable by name."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, fn, args, kwargs))
    process.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError(f"{fn.__name__} did not finish within {timeout} s")
        status, value = parent.recv()
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
    if status == "error":
        raise AssertionError(f"{fn.__name__} failed in its own process:\n{value}")
    return value


def corpus_run(scenario: str) -> dict:
    """A corpus scenario's summary in its detect run, as `make bench` runs it (to call in `isolated`)."""
    sys.path.insert(0, str(SCENARIOS))
    import _harness

    return _harness.run_one(scenario, "detect")["summary"]


def counts(finding: dict) -> bool:
    """Does a finding of a summary JSON make the verdict: a major leak, remedied or not (minor, benign and
    withdrawn findings are listed only)?"""
    return finding["state"] in ("leak", "remedied") and finding["severity"] == "major"


def kept(summary: dict) -> list[dict]:
    """The findings of a summary JSON that the end of the run bore out (all but the withdrawn live alerts)."""
    return [f for f in summary["findings"] if f["state"] != "withdrawn"]
