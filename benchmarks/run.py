"""`make bench`: run every benchmarks/bench_*.py in its own process, then assemble BENCHMARKS.md from
the sections they wrote to benchmarks/results/ (tracked, so running one benchmark keeps the others). A
benchmark that fails is reported, not hidden. BENCHMARKS.md leads with one results table per area (AREAS:
columns of the sections' own tables), and the sections follow in full as the method.
`python benchmarks/run.py --assemble` rewrites BENCHMARKS.md from the results without running anything."""

from __future__ import annotations

import os
import subprocess
import sys
import re
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Area:
    """One area of the results: its title, a sentence saying what was measured, and the table of a
    benchmark's section that answers it (the section's file, which of its tables, which columns; every
    column when `columns` is empty). The cells are the section's own, copied, never recomputed."""

    title: str
    what: str
    section: str
    table: int
    columns: tuple[str, ...] = ()


#: The results, one table per area, in the order a reader asks: what a run costs, how soon a leak is
#: found, whether it is found right, what the remedies do, then the frameworks' and the ranks' figures.
AREAS = (
    Area("Cost on real scripts", "Each unedited textbook script run plain and under `leakdoctor run`, "
         "alternately; ratio: whole-process wall time with the doctor over without.", "02_cost", 0,
         ("script", "plain (median)", "ratio", "range", "own line", "investigations / run", "verdicts")),
    Area("step() overhead", "`doctor.step()` at the defaults timed from outside, beside an empty call "
         "timed in the same loop.", "01_overhead", 5,
         ("process", "step", "step() median", "empty call median", "step() p90", "thread CPU", "total")),
    Area("Detection latency", "Steps from the start of a fast leak (bytes kept in a list) to its finding, "
         "at the defaults.", "01_overhead", 2,
         ("step", "leak from step", "leak per step", "cause", "steps to detect", "stride")),
    Area("Investigation cost", "One investigation of a torch loop that keeps its outputs, part by part.",
         "03_investigation", 0),
    Area("Textbook planted leaks", "One line of a published example script replaced by a classic bug, "
         "run under `leakdoctor run`.", "textbook", 0,
         ("scenario", "expected cause; severity", "found at off", "cause", "location ok", "severity as expected",
          "remedy")),
    Area("Clean textbook scripts", "The same scripts unedited, at the defaults and at `--remedies safe`.",
         "textbook", 1, ("script", "steps", "clean at defaults", "clean at safe", "unwatched", "withdrawn alerts",
                         "findings (runs)")),
    Area("Leak scenario corpus", "Leaking and benign training loops: leakdoctor against the rules users "
         "reach for.", "corpus", 1),
    Area("Remedies", "The corpus's leaks with `remedies=\"all\"`: the slope after the remedy against before.",
         "corpus", 4, ("scenario", "expected remedy", "applied", "verified effective",
                       "rate after / before (doctor)", "below 10%")),
    Area("Real-world scripts", "The frameworks' own example scripts: clean runs, and a planted leak in each.",
         "realworld", 0, ("scenario", "verdict at defaults", "verdict at safe", "planted leak found", "cause",
                          "location", "steps to detect")),
    Area("Memory: low-precision init", "Peak memory building 24 float16 layers: the naive way against "
         "`low_precision_init`.", "low_precision_init", 0),
    Area("Memory: the old optax RAdam", "A known JAX leak, as written and remedied.", "jax_radam", 0),
    Area("Memory: the MLX buffer cache", "`cap_cache` on a growing MLX buffer cache.", "mlx", 0),
    Area("Memory: Keras models built in a loop", "Resident memory over 40 models fitted one after another.",
         "keras", 1),
    Area("Callback overhead: Keras", "CPU time per batch with the callback over without.", "keras", 0),
    Area("Callback overhead: Lightning", "CPU time per step with the callback over without, and against "
         "Lightning's DeviceStatsMonitor.", "lightning", 0),
    Area("Callback overhead: MLX", "A correct MLX loop with and without the doctor.", "mlx", 1),
    Area("Distributed: ranks that stop together", "Two ranks, one leaking: from the ask to the common stop.",
         "distributed", 1),
)


def tables(markdown: str) -> list[list[list[str]]]:
    """The markdown tables of a section, each as rows of cells (the header first, the rule left out)."""
    found, rows = [], None
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            rows = [] if rows is None else rows
            if not re.fullmatch(r"\|[-:| ]+\|", line.strip()):  # the rule under the header is left out
                rows.append([c.strip() for c in line.strip()[1:-1].split(" | ")])
        elif rows is not None:
            found.append(rows)
            rows = None
    return found


def render(rows: list[list[str]], columns: tuple[str, ...]) -> str:
    """A table of the chosen columns (all when none are named), in the order named."""
    header = rows[0]
    keep = [header.index(c) for c in columns] if columns else list(range(len(header)))
    lines = ["| " + " | ".join(header[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    lines += ["| " + " | ".join(row[i] for i in keep) + " |" for row in rows[1:]]
    return "\n".join(lines)


def slug(heading: str, seen: dict[str, int]) -> str:
    """The anchor GitHub gives a heading (lowercase, punctuation dropped, spaces as hyphens, -1, -2, ...
    on a repeat), so that the results can link to their method."""
    base = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    count = seen.get(base, 0)
    seen[base] = count + 1
    return f"{base}-{count}" if count else base


def assemble() -> None:
    """Write BENCHMARKS.md from the sections in benchmarks/results/."""
    (ROOT / "BENCHMARKS.md").write_text(document(), encoding="utf-8")


def document() -> str:
    """BENCHMARKS.md: the results first, one table per area (copied from the sections), each linking to
    the section that says how it was measured; then every section in full, its headings one level down.
    What changed from one version to the next is in CHANGELOG.md, not here."""
    sections = {s.stem: s.read_text(encoding="utf-8").strip() for s in sorted(OUT.glob("*.md"))} if OUT.exists() else {}
    parts = ["# Benchmarks", "",
             f"Reproduce with `make bench` (all) or `.venv/bin/python benchmarks/run.py NAME ...`. "
             f"Last run on: {machine()}.", "",
             "The results come first, one table per area. Each links to its method: what was measured, how, "
             "and every column. Each benchmark runs in its own process. What changed between versions is in "
             "[CHANGELOG.md](CHANGELOG.md).", "", "## Results"]
    parts += results(sections) + ["", METHOD, "",
                                  "Each benchmark's section as it wrote it, with how it measured and what it found."]
    used = list(dict.fromkeys(area.section for area in AREAS if area.section in sections))
    parts += ["\n" + re.sub(r"^(#+) ", r"#\1 ", sections[stem], flags=re.M)
              for stem in used + [stem for stem in sections if stem not in used]]
    return linked("\n".join(parts) + "\n", sections)


METHOD = "## Method and full results"


def results(sections: dict[str, str]) -> list[str]:
    """The results part: each area's table, with a link (a placeholder until `linked`) to its method."""
    parts = []
    for area in AREAS:
        if area.section in sections:
            text, under = sections[area.section], where(sections[area.section], area.table)
            parts += ["", f"### {area.title}", "", area.what, "", render(tables(text)[area.table], area.columns),
                      "", f"Method and full results: [{under}](#@{area.section}@{under}@)."]
    return parts


def linked(text: str, sections: dict[str, str]) -> str:
    """`text` with each `#@section@heading@` placeholder replaced by the anchor of that heading in the
    method part (the section's own copy, not an area's title of the same words)."""
    seen: dict[str, int] = {}
    anchors, titles, stem, method = {}, {title(body): stem for stem, body in sections.items()}, None, False
    for line in text.splitlines():
        if heading := re.match(r"(#+) (.*)", line):
            anchor = slug(heading.group(2), seen)
            method = method or line == METHOD
            if method and heading.group(1) == "###":
                stem = titles.get(heading.group(2), stem)
            if stem:
                anchors.setdefault(f"{stem}@{heading.group(2)}", anchor)
    return re.sub(r"#@(\w+@[^@]+)@", lambda m: "#" + anchors[m.group(1)], text)


def where(section: str, table: int) -> str:
    """The heading under which a section's `table`-th table sits (the nearest above it)."""
    lines, count, heading = section.splitlines(), -1, title(section)
    for i, line in enumerate(lines):
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            count += 1
            if count == table:
                return heading
    raise ValueError(f"no table {table} in the section {title(section)!r}")


def title(section: str) -> str:
    """A section's own title: its first heading, without the hashes."""
    return section.splitlines()[0].lstrip("#").strip()


if __name__ == "__main__":
    if sys.argv[1:] == ["--assemble"]:
        assemble()
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
