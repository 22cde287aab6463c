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
    "tensorboard": {"tensorboard", "tensorboardx"},
    "mlflow": {"mlflow-skinny"},
    "wandb": {"wandb"},
    "ray": {"ray", "torch"},
}
#: The extras `all` leaves out (ray: ray, pyarrow and pandas are heavy, and Ray Train is a launcher, not a framework).
NOT_IN_ALL = {"ray"}
PROMISED["all"] = set().union(*(names for extra, names in PROMISED.items() if extra not in NOT_IN_ALL))
#: The core's own dependencies: every extra brings them.
CORE = {"leakdoctor", "psutil", "numpy"}
#: Keras backends: the `keras` extra must bring none of them.
BACKENDS = {"jax", "jaxlib", "torch", "tensorflow", "tensorflow-cpu"}
#: pip's words when the index cannot be reached (the only reason to skip).
UNREACHABLE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                         r"resolution|Name or service not known|Network is unreachable|ConnectTimeout|ProxyError|"
                         r"Max retries exceeded")
CALLBACKS = ["torch", "lightning", "keras", "flax", "mlx", "ray"]
#: What each callback module's framework is, to skip where it is not installed.
FRAMEWORK = {"torch": "torch", "lightning": "lightning", "keras": "keras", "flax": "flax", "mlx": "mlx", "ray": "ray"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def copy_project(dest: Path) -> Path:
    """A copy of what building the project reads, so that a build writes there, not in the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "leakdoctor", dest / "leakdoctor", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def fresh_venv(where: Path) -> Path:
    """A new virtual environment (pip and, on Python 3.11, setuptools in it); its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=120)
    return where / ("Scripts" if os.name == "nt" else "bin") / "python"


def skip_if_unreachable(errors: list[str]) -> None:
    """Skip when every pip failure says the package index could not be reached; otherwise return."""
    if errors and all(UNREACHABLE.search(err) for err in errors):
        pytest.skip(f"the package index is unreachable (pip: {UNREACHABLE.search(errors[0]).group(0)}; "
                    f"{errors[0].strip().splitlines()[-1]})")


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
    python = fresh_venv(tmp_path / "venv")
    projects = {extra: copy_project(tmp_path / f"project-{extra}") for extra in extras()}
    with ThreadPoolExecutor(2) as pool:
        resolved = dict(zip(projects, pool.map(lambda e: resolve(python, projects[e], e), projects)))
    failed = {e: err for e, (names, err) in resolved.items() if names is None}
    skip_if_unreachable(list(failed.values()))
    assert not failed, "\n\n".join(f"[{e}]:\n{err[-2000:]}" for e, err in failed.items())
    for extra, (names, _) in resolved.items():
        assert names is not None
        missing = (PROMISED[extra] | CORE) - names
        assert not missing, f".[{extra}] does not install {sorted(missing)}; it installs {sorted(names)}"
    keras_alone = resolved["keras"][0] or set()
    assert not keras_alone & BACKENDS, f".[keras] brings a backend after all: {sorted(keras_alone & BACKENDS)}"


# --- installed for real, one extra after another ------------------------------------------------------------

#: Keras alone (no backend installed yet, none set): the callback's import names the extra that brings one.
KERAS_ALONE = ("try:\n    import leakdoctor.callbacks.keras\nexcept ImportError as err:\n"
               "    assert 'pip install \".[keras-jax]\"' in str(err), err\n"
               "else:\n    raise SystemExit('leakdoctor.callbacks.keras imported with no Keras backend installed')")
#: Keras on `backend`: the callback imports (it derives from keras.callbacks.Callback) and is made.
KERAS_ON = ("import keras\nfrom leakdoctor.callbacks.keras import LeakDoctorCallback\n"
            "assert keras.backend.backend() == {0!r}, keras.backend.backend()\nLeakDoctorCallback(verbose=False)")


def doctor_step(module: str, imports: str, arguments: str) -> str:
    """Code that makes the doctor of leakdoctor.callbacks.`module` and steps it once: its import alone
    would not do, the callback modules import their framework only when a doctor is made."""
    return (f"import {imports}\nfrom leakdoctor.callbacks.{module} import LeakDoctor\n"
            f"with LeakDoctor({arguments}, verbose=False) as doctor:\n    doctor.step()")


#: (extra, code that must run once it is installed, KERAS_BACKEND), in the order they are installed.
INSTALLED: list[tuple[str, str, str | None]] = [
    ("keras", KERAS_ALONE, None),
    ("keras-jax", KERAS_ON.format("jax"), "jax"),
    ("jax", doctor_step("flax", "equinox, flax.nnx, optax", "tx=optax.adam(1e-3)"), None),
    ("torch", doctor_step("torch", "torch", "model=torch.nn.Linear(2, 2)"), None),
    ("keras-torch", KERAS_ON.format("torch"), "torch"),
    ("lightning", "from leakdoctor.callbacks.lightning import LeakDoctorCallback\nLeakDoctorCallback(verbose=False)",
     None),
    ("ray", "import ray.train, ray.train.torch\nfrom leakdoctor.callbacks import ray as leakdoctor_ray\n"
            "assert leakdoctor_ray.require_ray() is ray.train", None),
    ("mlx", doctor_step("mlx", "mlx.nn", "model=mlx.nn.Linear(2, 2)"), None),
    ("plot", "import os; from leakdoctor import Summary; from leakdoctor.reporting._plot import plot_summary; "
             "plot_summary(Summary('python', 0, {}, []), 'plot.png'); assert os.path.getsize('plot.png') > 1000", None),
    ("prometheus", "from leakdoctor.reporting import _exporter as exporter; assert exporter.require().__name__ == 'prometheus_client'", None),
    ("tensorboard", "from leakdoctor.trackers.tensorboard import summary_writer\nwriter = summary_writer()('tb')\n"
                    "writer.add_scalar('leakdoctor/x', 1.0, 0)\nwriter.close()", None),
    ("mlflow", "from leakdoctor.trackers import mlflow; assert mlflow.require().MlflowClient", None),
    ("wandb", "from leakdoctor.trackers import wandb; assert wandb.require().init", None),
]


def test_every_extra_installs_and_imports_in_a_fresh_venv(tmp_path: Path):
    """Issue #25, each extra importable in a fresh venv, for real: one new virtual environment; the project
    (a copy, editable, built as `make test` builds it) with its core dependencies, then `leakdoctor` imports
    and `leakdoctor --help` runs; then each extra's requirements, one extra after another, and after each
    what it is for runs in that environment: its callback imported and made (a doctor stepped once), the
    plot drawn, the exporter's prometheus_client found. The order makes each check count: `keras` first,
    while no backend is there (its callback's ImportError names `.[keras-jax]`), then Keras on jax, the JAX
    doctor with flax, optax and equinox, torch's doctor (before lightning is there), Keras on torch,
    lightning, Ray Train (ray.train found by leakdoctor's helper), mlx, the plot, the exporter. `all` is only
    resolved (above): it adds nothing to these. Affordable on a 2-core CI machine (about a minute): one
    environment, every version pinned by requirements-dev.lock (the wheels `make test` installed, from pip's
    cache where it has them), nothing byte-compiled at install. Skips only when pip cannot reach the package index."""
    assert {extra for extra, _, _ in INSTALLED} == set(extras()) - {"all"}, "say here what a new extra imports"
    python = fresh_venv(tmp_path / "venv")

    def install(*requirements: str) -> None:
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-compile", "--retries", "1",
             "--timeout", "30", "--disable-pip-version-check", "-c", str(ROOT / "requirements-dev.lock"),
             *requirements], capture_output=True, text=True, timeout=600)
        skip_if_unreachable([done.stderr] if done.returncode else [])
        assert done.returncode == 0, f"pip install {' '.join(requirements)}:\n{done.stderr[-3000:]}"

    def run(after: str, *command: str, backend: str | None = None) -> str:
        env = keras_env(tmp_path, backend)
        env.pop("PYTHONPATH", None)
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, f"after {after}: {command[-1]}\n{done.stdout[-1000:]}{done.stderr[-3000:]}"
        return done.stdout

    install("-e", str(copy_project(tmp_path / "project")))
    run("the core", str(python), "-c", "import leakdoctor")
    assert "demo" in run("the core", str(python.parent / "leakdoctor"), "--help")
    for extra, code, backend in INSTALLED:
        install(*extras()[extra])
        run(f".[{extra}]", str(python), "-c", code, backend=backend)


# --- in the dev environment ---------------------------------------------------------------------------------

def keras_env(tmp_path: Path, backend: str | None) -> dict[str, str]:
    """An environment whose Keras uses `backend` (None: Keras's own default) and keeps its keras.json out
    of the user's home."""
    env = {**os.environ, "KERAS_HOME": str(tmp_path / "keras-home"), "OPENBLAS_NUM_THREADS": "1"}
    env.pop("KERAS_BACKEND", None)
    return env if backend is None else {**env, "KERAS_BACKEND": backend}


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


def test_ray_report_without_ray_names_the_extra():
    """Importing leakdoctor.callbacks.ray needs no ray; report() without it is an ImportError that names
    `pip install leakdoctor[ray]`."""
    code = ("import sys; sys.modules['ray'] = None\nfrom leakdoctor.callbacks import ray as leakdoctor_ray\n"
            "try:\n    leakdoctor_ray.report(None)\nexcept ImportError as err:\n    print('ImportError', err)\n"
            "else:\n    print('reported')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ImportError") and "pip install leakdoctor[ray]" in done.stdout, done.stdout
