"""`make bench`: run every benchmarks/bench_*.py in its own process, then assemble BENCHMARKS.md from
the sections they wrote to benchmarks/results/ (tracked, so running one benchmark keeps the others). A benchmark that fails is reported, not hidden."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import OUT, machine  # noqa: E402

ROOT = Path(__file__).parent.parent


def main(names: list[str]) -> int:
    scripts = sorted(Path(__file__).parent.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names]
    failed = []
    for script in scripts:
        start = time.perf_counter()
        print(f"== {script.name}", flush=True)
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        if subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env).returncode:
            failed.append(script.name)
        print(f"   {time.perf_counter() - start:.0f} s", flush=True)
    assemble()
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


def assemble() -> None:
    sections = sorted(OUT.glob("*.md")) if OUT.exists() else []
    parts = ["# Benchmarks", "",
             f"Reproduce with `make bench` (all) or `.venv/bin/python benchmarks/run.py NAME ...`. "
             f"Last run on: {machine()}.", "",
             "Each benchmark runs in its own process; each section says what it measured and how."]
    parts += ["\n" + s.read_text(encoding="utf-8").strip() for s in sections]
    (ROOT / "BENCHMARKS.md").write_text("\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
