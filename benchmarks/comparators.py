"""The detection rules users reach for instead of leakdoctor, each reduced to one precise decision: the
first step at which it raises an alarm (None: never), and what it points at.

Every rule ignores the scenario's warm-up (leakdoctor's: 20 steps, or 3 calls for the Keras callback,
whose steps are fit/predict calls) and looks every `check` steps (10; every other call for Keras).

Series rules read the resident memory recorded after every step (the detect run's series, the one
leakdoctor saw), from the end of the warm-up on:
  * threshold: "RSS grew more than RISE over its level at the end of warm-up", checked every step;
  * stormlog: the `detect_memory_leaks` of stormlog 0.4.3's two analyzers that take a series (an object
    with `memory_usage`, as their own CLIs build it), called every `check` steps on the samples since
    the warm-up; an alarm is a non-empty result. The JAX analyzer fits a line and flags a slope above 0.1% of
    the series' maximum per sample; the TensorFlow analyzer flags increases in over 70% of successive
    samples, samples above mean + 3 sigma, and a last-5 mean 1.5x the first-5 mean. (stormlog's PyTorch
    analyzer cannot take a series: it groups its own profiler's per-function results and needs 100 MB of
    total growth.)
Look rules read what a tool showed at each look, every `check` steps from the end of the warm-up (the
first look only sets the baseline):
  * objgraph: `objgraph.growth()` lists the types whose count rose above their previous peak; an alarm
    when one type is listed at CONSECUTIVE looks in a row;
  * tracemalloc: a snapshot diffed by line against the previous look's; an alarm when one line grew by at
    least FLOOR bytes at CONSECUTIVE looks in a row. It points at that line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

WARMUP = 20
CHECK = 10
RISE = 0.10
CONSECUTIVE = 3
FLOOR = 1024
MIB = 2**20


@dataclass(frozen=True)
class Alarm:
    """The first step at which a rule fired (None: it never did), what it points at, and why."""

    step: int | None
    where: str | None = None
    detail: str = ""


def threshold(rss: Sequence[float], warmup: int = WARMUP, every: int = CHECK, rise: float = RISE) -> Alarm:
    """RSS after a step above (1 + rise) times RSS after the last warm-up step, checked after every step
    (`every` is unused). rss[i] is the reading after step i+1."""
    if len(rss) <= warmup:
        return Alarm(None)
    base = rss[warmup - 1]
    for i in range(warmup, len(rss)):
        if rss[i] > (1 + rise) * base:
            return Alarm(i + 1, detail=f"{rss[i] / MIB:.0f} MiB > {1 + rise:.2f} x {base / MIB:.0f} MiB")
    return Alarm(None)


@dataclass
class _Tracked:
    """What stormlog's CLIs hand `detect_memory_leaks`: memory_usage (MiB), timestamps, growth rate."""

    memory_usage: list[float]
    timestamps: list[float]
    memory_growth_rate: float = 0.0


def online(detect: Callable[[Any], list[dict]], rss: Sequence[float], warmup: int = WARMUP,
           every: int = CHECK) -> Alarm:
    """Call a series analyzer every `every` steps on the samples since the warm-up; the first non-empty
    answer is the alarm."""
    for end in range(warmup + every, len(rss) + 1, every):
        usage = [v / MIB for v in rss[warmup:end]]
        found = detect(_Tracked(usage, [float(i) for i in range(len(usage))]))
        if found:
            return Alarm(end, detail="; ".join(f"{f.get('type')}: {f.get('description')}" for f in found))
    return Alarm(None)


def stormlog_drift(rss: Sequence[float], warmup: int = WARMUP, every: int = CHECK) -> Alarm:
    """stormlog.jax.analyzer.MemoryAnalyzer().detect_memory_leaks (linear drift)."""
    from stormlog.jax.analyzer import MemoryAnalyzer

    return online(MemoryAnalyzer().detect_memory_leaks, rss, warmup, every)


def stormlog_patterns(rss: Sequence[float], warmup: int = WARMUP, every: int = CHECK) -> Alarm:
    """stormlog.tensorflow.analyzer.MemoryAnalyzer().detect_memory_leaks (monotonic, spikes, growth)."""
    from stormlog.tensorflow.analyzer import MemoryAnalyzer

    return online(MemoryAnalyzer().detect_memory_leaks, rss, warmup, every)


def streak(looks: Sequence[dict], grew: Callable[[list], bool], consecutive: int = CONSECUTIVE) -> Alarm:
    """The first look at which one key (a type, a line) has grown at `consecutive` looks in a row. Each
    look is {"step": s, "grown": [[key, ...], ...]}; the first look is the baseline."""
    run: dict[str, int] = {}
    for look in looks[1:]:
        keys = {entry[0] for entry in look["grown"] if grew(entry)}
        run = {key: run.get(key, 0) + 1 for key in keys}
        hits = [key for key, n in run.items() if n >= consecutive]
        if hits:
            entry = next(e for e in look["grown"] if e[0] in hits)
            detail = f"{entry[0]} +{entry[1]} at {consecutive} looks in a row"
            return Alarm(look["step"], where=str(entry[0]), detail=detail)
    return Alarm(None)


def objgraph_peaks(looks: Sequence[dict]) -> Alarm:
    return streak(looks, lambda entry: entry[1] > 0)


def tracemalloc_lines(looks: Sequence[dict], floor: int = FLOOR) -> Alarm:
    return streak(looks, lambda entry: entry[1] >= floor)


#: Name shown in the tables -> (kind of input, rule).
RULES: dict[str, tuple[str, Callable[..., Alarm]]] = {
    f"RSS +{RISE:.0%} threshold": ("series", threshold),
    "stormlog drift (JAX analyzer)": ("series", stormlog_drift),
    "stormlog patterns (TF analyzer)": ("series", stormlog_patterns),
    "objgraph growth() peaks": ("objgraph", objgraph_peaks),
    "tracemalloc snapshot diffs": ("tracemalloc", tracemalloc_lines),
}
