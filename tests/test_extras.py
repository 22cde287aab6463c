"""The extras as a newcomer installs them. Each extra of pyproject.toml, resolved from the package index in
a fresh virtual environment (`pip install --dry-run --report`: metadata only, nothing installed), brings
the frameworks it promises, and `keras` alone brings no backend. In the dev environment every callback
module imports, and importing the Keras callback where Keras cannot import its backend fails with an
ImportError that names the extras that bring one."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINUX = sys.platform.startswith("linux")

#: What each extra must install (distribution names, normalised).
PROMISED: dict[str, set[str]] = {
    "torch": {"torch"},
    "lightning": {"lightning", "torch"},
    "keras": {"keras"},
    "keras-jax": {"keras", "jax", "jaxlib"},
    "keras-torch": {"keras", "torch"},
    "jax": {"jax", "jaxlib", "flax", "optax", "equinox"},
    "mlx": {"mlx", "mlx-cpu"} if LINUX else {"mlx"},
    "plot": {"matplotlib"},
    "prometheus": {"prometheus-client"},
}
PROMISED["all"] = set().union(*PROMISED.values())
#: The core's own dependencies: every extra brings them.
CORE = {"leakdoctor", "psutil", "numpy"}
#: Keras backends: the `keras` extra must bring none of them.
BACKENDS = {"jax", "jaxlib", "torch", "tensorflow", "tensorflow-cpu"}
#: pip's words when the index cannot be reached (the only reason to skip).
UNREACHABLE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                         r"resolution|Name or service not known|Network is unreachable|ConnectTimeout|ProxyError|"
                         r"Max retries exceeded")
CALLBACKS = ["torch", "lightning", "keras", "flax", "mlx"]
#: What each callback module's framework is, to skip where it is not installed.
FRAMEWORK = {"torch": "torch", "lightning": "lightning", "keras": "keras", "flax": "flax", "mlx": "mlx"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def resolve(python: Path, project: Path, extra: str) -> tuple[set[str] | None, str]:
    """The distributions `pip install ".[extra]"` would install into a fresh environment, or None and pip's
    stderr when it fails. Run in `project`, a copy of the checkout of its own (the build writes there)."""
    report = project / "report.json"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report", str(report),
         "--retries", "1", "--timeout", "30", "--disable-pip-version-check", f".[{extra}]"],
        cwd=project, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return None, done.stderr
    return {normalise(item["metadata"]["name"]) for item in json.loads(report.read_text())["install"]}, done.stderr


def test_every_extra_is_promised_something():
    assert set(extras()) == set(PROMISED), "an extra was added or removed: say here what it installs"


def test_every_extra_resolves_to_the_frameworks_it_promises(tmp_path: Path):
    """One fresh virtual environment; every extra resolved in it, two at a time (pip waits on the network)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    projects = {}
    for extra in extras():
        projects[extra] = tmp_path / f"project-{extra}"
        projects[extra].mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, projects[extra] / name)
        shutil.copytree(ROOT / "leakdoctor", projects[extra] / "leakdoctor",
                        ignore=shutil.ignore_patterns("__pycache__"))
    with ThreadPoolExecutor(2) as pool:
        resolved = dict(zip(projects, pool.map(lambda e: resolve(python, projects[e], e), projects)))
    failed = {e: err for e, (names, err) in resolved.items() if names is None}
    if failed and all(UNREACHABLE.search(err) for err in failed.values()):
        first = next(iter(failed.values()))
        pytest.skip(f"the package index is unreachable (pip: {UNREACHABLE.search(first).group(0)}; "
                    f"{first.strip().splitlines()[-1]})")
    assert not failed, "\n\n".join(f"[{e}]:\n{err[-2000:]}" for e, err in failed.items())
    for extra, (names, _) in resolved.items():
        assert names is not None
        missing = (PROMISED[extra] | CORE) - names
        assert not missing, f".[{extra}] does not install {sorted(missing)}; it installs {sorted(names)}"
    keras_alone = resolved["keras"][0] or set()
    assert not keras_alone & BACKENDS, f".[keras] brings a backend after all: {sorted(keras_alone & BACKENDS)}"


# --- in the dev environment ---------------------------------------------------------------------------------

def keras_env(tmp_path: Path, backend: str) -> dict[str, str]:
    """An environment whose Keras uses `backend` and keeps its keras.json out of the user's home."""
    return {**os.environ, "KERAS_BACKEND": backend, "KERAS_HOME": str(tmp_path / "keras-home"),
            "OPENBLAS_NUM_THREADS": "1"}


@pytest.mark.parametrize("module", CALLBACKS)
def test_every_callback_module_imports(module: str, tmp_path: Path):
    if importlib.util.find_spec(FRAMEWORK[module]) is None:
        pytest.skip(f"{FRAMEWORK[module]} is not installed here")
    backend = "jax" if importlib.util.find_spec("jax") else "torch"
    done = subprocess.run([sys.executable, "-c", f"import leakdoctor.callbacks.{module}"], capture_output=True,
                          text=True, env=keras_env(tmp_path, backend), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("backend,hidden", [("tensorflow", False), ("jax", True), ("torch", True)])
def test_keras_without_its_backend_names_the_extras(backend: str, hidden: bool, tmp_path: Path):
    """KERAS_BACKEND names a backend that cannot be imported (not installed, or hidden here): the import of
    the callback is an ImportError that names the backend and `pip install ".[keras-jax]"` / `".[keras-torch]"`."""
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed here")
    if not hidden and importlib.util.find_spec(backend) is not None:
        pytest.skip(f"{backend} is installed here")
    hide = f"import sys; sys.modules[{backend!r}] = None; " if hidden else ""
    code = (f"{hide}\ntry:\n    import leakdoctor.callbacks.keras\nexcept ImportError as err:\n"
            f"    print(type(err).__name__, err)\nelse:\n    print('imported')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=keras_env(tmp_path, backend), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout
    assert said.startswith("ImportError"), said
    assert f"backend {backend!r}" in said and "KERAS_BACKEND" in said, said
    assert 'pip install ".[keras-jax]"' in said and 'pip install ".[keras-torch]"' in said, said
