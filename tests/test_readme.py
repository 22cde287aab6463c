"""The README and the docs pages that hold what it used to say (docs/*.md) as a newcomer meets them:
every ```python snippet runs as written (each in a fresh process, with tiny models: the names a snippet
takes as yours come from a prelude kept here, keyed by the heading the snippet sits under; a snippet shown
word for word on two pages runs once), the CI snippet passes silently under the pytest plugin and fails with the summary when its step
leaks, the summary printed in "How to read a summary" (README) and "The example run" (docs) is what that
loop prints, and the Layout section of docs/development.md lists the package's tree."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The README and the docs pages that hold what the README used to say: their snippets run here.
PAGES = [README, *(DOCS / name for name in (
    "index.md", "getting-started.md", "frameworks.md", "reading-a-summary.md", "summary-json.md",
    "how-it-decides.md", "causes-and-remedies.md", "options.md", "command-line.md", "pytest-plugin.md",
    "limits-and-ooms.md", "distributed.md", "prometheus.md", "guarantees.md", "faq.md", "development.md"))]
#: Every page a user reads: no scaffolding on any of them.
ALL_PAGES = [README, *sorted(DOCS.glob("*.md"))]
#: A snippet whose first line starts so is an excerpt by nature: it is not run. Keep them few.
FRAGMENT = "# fragment"
MAX_FRAGMENTS = 3
#: The snippet that is a test file: run under the pytest plugin, not as a script.
CI = "A leak test for CI"
#: The snippet whose printed summary the README shows: run by its own test, which compares the two.
SHOWN = "How to read a summary"
#: The same snippet and its whole printed summary on the docs site (a page, its heading).
SHOWN_DOCS = (DOCS / "reading-a-summary.md", "The example run")
#: Where the glossary and the package's layout are (a page, its heading).
GLOSSARY = (DOCS / "reading-a-summary.md", "Glossary")
LAYOUT = (DOCS / "development.md", "Layout")
SNIPPET_TIMEOUT = 240

#: What each heading's snippet takes as the user's own (`model`, `data`, ...), as small as can be.
PRELUDES: dict[str, str] = {
    "Plain Python (any loop)": """
        class Graph:
            def __init__(self):
                self.nodes = []

        class Trainer:
            def __init__(self):
                self.history = []

        graph, trainer, data = Graph(), Trainer(), range(40)

        def train_step(batch):
            graph.nodes[:] = [batch]
            trainer.history[:] = [batch]
        """,
    "PyTorch": """
        import torch

        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = torch.nn.MSELoss()
        loader = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(40)]
        """,
    "Lightning": """
        import lightning as L
        import torch

        class Model(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(8, 1)

            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.mse_loss(self.layer(x), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        class Data(L.LightningDataModule):
            def train_dataloader(self):
                data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
                return torch.utils.data.DataLoader(data, batch_size=8)

        model, datamodule = Model(), Data()
        """,
    "Keras 3 (any backend)": """
        import keras
        import numpy as np

        x, y = np.random.rand(32, 8).astype("float32"), np.random.rand(32, 1).astype("float32")

        def build_model(units):
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(units, activation="relu"),
                                      keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            return model
        """,
    "Flax / Optax / Equinox": """
        import jax
        import jax.numpy as jnp
        import optax
        from flax import nnx
        from flax.training import train_state

        state = train_state.TrainState.create(apply_fn=None, params={"w": jnp.zeros((8, 1))}, tx=optax.sgd(0.01))
        data = [(jnp.ones((16, 8)), jnp.ones((16, 1)))] * 30

        @jax.jit
        def train_step(state, batch):
            x, y = batch
            loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] - y) ** 2))(state.params)
            return state.apply_gradients(grads=grads), loss

        model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)
        """,
    "MLX": """
        import mlx.core as mx
        import mlx.nn as nn
        import mlx.optimizers as optim

        model = nn.Linear(8, 1)
        optimizer = optim.SGD(learning_rate=0.01)
        loss_and_grad = nn.value_and_grad(model, lambda model, x, y: nn.losses.mse_loss(model(x), y))
        batches = [(mx.random.normal((16, 8)), mx.random.normal((16, 1))) for _ in range(30)]
        """,
}

#: The frameworks a heading's snippet needs (skipped, with the reason, where one is not installed).
NEEDS: dict[str, tuple[str, ...]] = {
    "PyTorch": ("torch",), "Lightning": ("lightning", "torch"), "Keras 3 (any backend)": ("keras",),
    "Flax / Optax / Equinox": ("jax", "flax", "optax"), "MLX": ("mlx.core",),
    "How to read a summary": ("torch",),
}

#: The CI snippet's helpers: a step that keeps nothing, and one that keeps 32 KiB a step.
CI_CLEAN = """
    import numpy as np

    def make_model():
        return {"w": np.zeros((64, 64))}

    def train_step(model):
        model["w"] -= 0.01 * (model["w"] @ np.ones((64, 64)))

    def eval_step(model):
        float((model["w"] @ np.ones(64)).sum())

    MODEL = make_model()
    """
CI_LEAK = CI_CLEAN + """
    KEPT = []

    def train_step(model):
        KEPT.append(model["w"].copy())

    def eval_step(model):
        KEPT.append(model["w"].copy())
    """


def snippets(pages: list[Path] = PAGES) -> list[tuple[str, str]]:
    """(heading, code) of every ```python block of the pages, the heading being the nearest above it (a
    line of another fenced block is no heading)."""
    found = []
    for page in pages:
        heading, block, other = "", None, False
        for line in page.read_text(encoding="utf-8").splitlines():
            if block is not None:
                if line.startswith("```"):
                    found.append((heading, "\n".join(block) + "\n"))
                    block = None
                else:
                    block.append(line)
            elif line.startswith("```python"):
                block = []
            elif line.startswith("```"):
                other = not other
            elif line.startswith("#") and not other:
                heading = line.lstrip("#").strip()
    return found


def is_fragment(code: str) -> bool:
    return code.lstrip().startswith(FRAGMENT)


RUNNABLE = list(dict.fromkeys((h, c) for h, c in snippets()
                               if not is_fragment(c) and h not in (CI, SHOWN, SHOWN_DOCS[1])))


def section(heading: str, page: Path = README) -> str:
    """A page's text under `## heading`, up to the next `## `."""
    return page.read_text(encoding="utf-8").split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def needs(heading: str) -> None:
    missing = [m for m in NEEDS.get(heading, ()) if importlib.util.find_spec(m.split(".")[0]) is None
               or importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the {heading!r} snippet needs {', '.join(missing)}, not installed here")


def environment() -> dict[str, str]:
    """The snippets' environment: a Keras backend that is installed, one BLAS thread, a headless matplotlib."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env.setdefault("KERAS_BACKEND", "jax" if importlib.util.find_spec("jax") else "torch")
    return env


def run_script(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, path.name], cwd=path.parent, env=environment(), capture_output=True,
                          text=True, timeout=SNIPPET_TIMEOUT)


# --- what the README is made of -----------------------------------------------------------------------

def test_fragments_are_few_and_every_prelude_has_its_snippet():
    fragments = [h for h, c in snippets() if is_fragment(c)]
    assert len(fragments) <= MAX_FRAGMENTS, f"too many `{FRAGMENT}` snippets: {fragments}"
    headings = {h for h, _ in RUNNABLE} | {SHOWN}
    assert set(PRELUDES) <= headings, f"preludes without a snippet: {set(PRELUDES) - headings}"
    assert len({c for h, c in snippets() if h == CI}) == 1


def test_every_page_snippet_is_found():
    """The docs pages' snippets are run too: the framework pages hold every framework's snippet."""
    headings = {h for h, _ in snippets([DOCS / "frameworks.md"])}
    assert set(PRELUDES) <= headings, set(PRELUDES) - headings


@pytest.mark.parametrize("page", ALL_PAGES, ids=[p.name for p in ALL_PAGES])
def test_no_scaffolding_issue_numbers_or_pypi_install(page: Path):
    text = page.read_text(encoding="utf-8")
    assert "<!--" not in text
    assert not re.search(r"\(issue #\d+\)|issue #\d+|where this leakdoctor", text)
    commands = re.findall(r'pip install ("[^"\n]*"|[^\s`]+)(`? ?\w*)', text)  # (what, what follows)
    if page in (README, DOCS / "getting-started.md"):
        assert any(what == '".[torch]"' for what, _ in commands), f"{page.name} shows how to install from the checkout"
    for what, after in commands:  # not on PyPI: from the checkout or the repository, or said to fail
        assert what.startswith('".[') or "@ git+" in what or after == "` fails", (what, after)


def test_the_glossary_explains_the_statistical_words():
    glossary = section(GLOSSARY[1], GLOSSARY[0])
    for word in ("warm-up", "window", "horizon", "materiality", "Mann–Kendall", "Theil–Sen", "stride",
                 "cleanup ladder", "investigation"):
        assert f"**{word}" in glossary, word


def test_the_layout_section_lists_the_tree():
    """Every module and folder under leakdoctor/, one line each with what it is, and nothing else."""
    block = section(LAYOUT[1], LAYOUT[0]).split("```text\n", 1)[1].split("```", 1)[0]
    listed, stack = set(), []
    for line in block.splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name, _, meaning = line.strip().partition(" ")
        assert name == "leakdoctor/" or meaning.strip(), f"no meaning on the Layout line {line!r}"
        stack[depth:] = [name]
        listed.add("".join(stack).rstrip("/"))
    package = ROOT / "leakdoctor"
    tree = {str(p.relative_to(ROOT)) for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    tree |= {str(p.relative_to(ROOT)) for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    tree.add("leakdoctor")
    assert sorted(tree - listed) == [], "in the tree, not in the Layout of docs/development.md"
    assert sorted(listed - tree) == [], "in the Layout of docs/development.md, not in the tree"


# --- every snippet runs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("heading,code", RUNNABLE, ids=[re.sub(r"\W+", "-", h).strip("-") for h, _ in RUNNABLE])
def test_snippet_runs(heading: str, code: str, tmp_path: Path):
    needs(heading)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PRELUDES.get(heading, "")) + "\n" + code)
    done = run_script(script)
    assert done.returncode == 0, f"the {heading!r} snippet failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert re.search(r"^leakdoctor: .*verdict [A-Z]+$", done.stderr, re.M), done.stderr[-3000:]  # the doctor ran


def test_the_summary_shown_is_what_the_loop_prints(tmp_path: Path):
    """The example summary, in the README and on the docs site, comes from its loop (the same loop on
    both): the same verdict, why line, columns and finding (the numbers are the machine's)."""
    heading = SHOWN
    needs(heading)
    texts = [section(heading), section(SHOWN_DOCS[1], SHOWN_DOCS[0])]
    codes = {text.split("```python\n", 1)[1].split("```", 1)[0] for text in texts}
    assert len(codes) == 1, "the README and docs/reading-a-summary.md show the same loop"
    shown = [line for text in texts for line in text.split("```text\n", 1)[1].split("```", 1)[0].splitlines()]
    script = tmp_path / "train.py"
    script.write_text(codes.pop())
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-5000:]
    printed = done.stderr.splitlines()
    for line in shown:
        if line.startswith(("leakdoctor: torch", "  why:", "[LEAK]", "  where:")) or line.startswith("metric "):
            assert words(line) == next((words(p) for p in printed if p.split()[:2] == line.split()[:2]),
                                       None), f"README shows {line!r}; the run printed:\n{done.stderr}"


def words(line: str) -> list[str]:
    """A summary line's first six tokens less the plain numbers (a rate in bytes is the machine's; a
    count such as `1/step` is compared)."""
    return [token for token in line.split()[:6] if not re.fullmatch(r"-?[\d.]+", token)]


# --- the CI snippet, under the pytest plugin --------------------------------------------------------------

def ci_run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, str]:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rP", *args)
    return result, result.stdout.str()


def test_the_ci_snippet_passes_silently_and_fails_with_the_summary(pytester: pytest.Pytester):
    """A passing leak check prints nothing and warns nothing (also under -W error, where a warning would
    be printed instead); a leaking step fails with the summary. (The leaking module runs first: see the
    next test for a clean check that comes first in its process.)"""
    code = next(c for h, c in snippets() if h == CI)
    pytester.makepyfile(test_ci_1_leak=textwrap.dedent(CI_LEAK) + "\n" + code,
                        test_ci_2_clean=textwrap.dedent(CI_CLEAN) + "\n" + code)
    for extra in ((), ("-W", "error")):
        result, out = ci_run(pytester, *extra)
        result.assert_outcomes(passed=2, failed=2)
        assert "warnings summary" not in out, out
        assert "Captured" not in out, out  # -rP shows a passing test's output; a failure's, too
        assert out.count("the step leaks memory") >= 2 and "verdict LEAK" in out, out


def test_a_clean_check_that_comes_first_passes(pytester: pytest.Pytester):
    """A clean check first in its process: the doctor may see resident memory creep (its own records,
    traced by tracemalloc, and its investigation's snapshots) and name nothing (native_memory); malloc's
    bytes in use show the step keeps nothing, so the check passes, silently."""
    code = next(c for h, c in snippets() if h == CI)
    pytester.makepyfile(test_ci_1_clean=textwrap.dedent(CI_CLEAN) + "\n" + code,
                        test_ci_2_leak=textwrap.dedent(CI_LEAK) + "\n" + code)
    result, out = ci_run(pytester)
    result.assert_outcomes(passed=2, failed=2)
    assert "Captured" not in out and "warnings summary" not in out, out
