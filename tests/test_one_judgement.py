"""One bug, one answer (issue #38, "one judgement behind every entry point"): the same planted PyTorch bug
(tests/scripts/planted_torch.py) run through the torch callback (the script steps the doctor itself),
through `leakdoctor run` on an unedited loop, and through the pytest plugin on a test whose body is the
step, each in its own process. The three summaries' leaks have the same cause, holder, file and line.
(Before: the plugin named a list of outputs kept with their graphs `native_memory` at the line that
allocates, and passed a hook added every step.)"""

from __future__ import annotations

import json
import re
import sys

import pytest
from helpers import place
from procs import SCRIPTS, leakdoctor_run, run

pytest_plugins = ["pytester"]

pytest.importorskip("torch")

TESTS = f'''
import sys

sys.path.insert(0, {str(SCRIPTS)!r})

import pytest

import planted_torch


@pytest.mark.leakcheck(steps=300, summary_path="plugin_graphs.json")
def test_graphs():
    planted_torch.graphs_step()


@pytest.mark.leakcheck(steps=300, summary_path="plugin_hooks.json")
def test_hooks():
    planted_torch.hooks_step()
'''

#: The bug, the cause every entry point must give, and the marker of its line in planted_torch.py.
BUGS = {"graphs": ("retained_graph", "GRAPHS"), "hooks": ("hook_accumulation", "HOOKS")}


def line_of(marker: str) -> int:
    lines = (SCRIPTS / "planted_torch.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"# {marker}" in line)


def leaks(path) -> set[tuple[str, str, str, int]]:
    """(cause, holder, file name, line) of each leak of the summary at `path`."""
    found = set()
    for finding in json.loads(path.read_text())["findings"]:
        if finding["state"] != "leak":
            continue
        where = re.fullmatch(r"(?:(.*) \()?(.*?)([^/\\]+\.py):(\d+)\)?", place(finding) or "")
        assert where, finding
        found.add((finding["cause"], where.group(1) or "", where.group(3), int(where.group(4))))
    return found


@pytest.mark.parametrize("bug", BUGS)
def test_the_callback_the_run_and_the_plugin_name_one_bug_alike(tmp_path, pytester, bug):
    cause, marker = BUGS[bug]
    callback = tmp_path / "callback.json"
    result = run([sys.executable, SCRIPTS / "planted_loop.py", bug, "300", "--doctor", callback], cwd=tmp_path)
    assert result.returncode == 0 and callback.exists(), result.stderr
    ran = tmp_path / "run.json"
    result = run(leakdoctor_run("-o", "overhead=1.0", "-o", "memory_limit=4GiB", "--summary", ran,
                                SCRIPTS / "planted_loop.py", bug, "300"), cwd=tmp_path)
    assert result.returncode == 0 and ran.exists(), result.stderr
    pytester.makepyfile(test_planted=TESTS)
    outcome = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", "-q",
                                            "-k", bug)
    outcome.assert_outcomes(failed=1)
    plugin = pytester.path / f"plugin_{bug}.json"
    answers = {"callback": leaks(callback), "run": leaks(ran), "plugin": leaks(plugin)}
    assert len({frozenset(found) for found in answers.values()}) == 1, answers
    assert [(c, name, line) for c, _, name, line in answers["plugin"]] == [(cause, "planted_torch.py", line_of(marker))], \
        answers
