"""The pytest plugin, in a real pytest run of its own: a leaking step fails the test with the
summary, a clean one passes, through the marker and through the fixture."""

pytest_plugins = ["pytester"]

TESTS = '''
import numpy as np
import pytest

KEPT = []

@pytest.mark.leakcheck(steps=250)
def test_marked_leak():
    KEPT.append(np.ones(40_000))

@pytest.mark.leakcheck(steps=250)
def test_marked_clean():
    np.ones(40_000).sum()

def test_fixture_leak(leak_check):
    cache = []
    leak_check(lambda: cache.append(np.ones(40_000)), steps=250)

def test_fixture_clean(leak_check):
    summary = leak_check(lambda: np.ones(40_000).sum(), steps=250)
    assert summary.verdict == "clean" and summary.steps == 250
'''


def test_plugin_fails_leaking_steps_and_passes_clean_ones(pytester):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*FAILED*test_marked_leak*", "*FAILED*test_fixture_leak*"])
    result.stdout.fnmatch_lines(["*the step leaks memory*", "*python_objects on rss_bytes*"])
