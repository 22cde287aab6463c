"""Shared by the benchmark scripts: where sections go and how to describe the machine."""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path
from typing import Callable, Sequence

import psutil

OUT = Path(__file__).parent / "results"


def write_section(name: str, markdown: str) -> Path:
    """Save one benchmark's section; benchmarks/run.py puts the sections into BENCHMARKS.md."""
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{name}.md"
    path.write_text(markdown.strip() + "\n", encoding="utf-8")
    return path


def machine() -> str:
    """One line about the machine the figures were measured on."""
    mem = psutil.virtual_memory().total / 2**30
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
            f"Python {platform.python_version()}, {platform.system()} {platform.release()}")


def paired_ratio(run_a: Callable[[], float], run_b: Callable[[], float], pairs: int) -> tuple[float, list[float]]:
    """Median of b/a over `pairs` back-to-back runs of both (alternating which goes first), so drift of
    the machine (other load, frequency) hits both sides of each pair alike."""
    ratios = []
    for i in range(pairs):
        if i % 2:
            b, a = run_b(), run_a()
        else:
            a, b = run_a(), run_b()
        ratios.append(b / a)
    return statistics.median(ratios), ratios


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
