"""A PNG of a run (the [plot] extra: matplotlib): resident memory, then one panel per growing series
and per series that proved a finding (its metric, and the hooks, compiles, live arrays or container length
it explains), with the warm-up, each growth's onset and detection, each remedy and the stop marked
and named in a legend beside the panel, so nothing is hidden behind the data or another mark. Axes read
in steps and in human units (MiB/GiB, ms/s), never in offset notation; the title says the verdict and
the steps.

Uses matplotlib's object API without pyplot, so no global backend or figure state is touched."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from leakdoctor._base.findings import Finding, SeriesSummary, proving

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class PlottedSummary(Protocol):
    """What the figure reads of a summary: reporting/summary.py's Summary, which imports this module to draw
    itself, so this one names the fields it reads instead of importing it back."""

    framework: str
    steps: int
    series: dict[str, SeriesSummary]
    findings: list[Finding]
    settings: dict[str, Any]
    stopped: dict[str, Any] | None
    unwatched: dict[str, Any] | None
    calls: list[dict[str, Any]] | None

    @property
    def verdict(self) -> str: ...

#: Unit ladders: (size, suffix), largest first; a count has no suffix.
UNITS: dict[str, tuple[tuple[float, str], ...]] = {
    "bytes": ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")),
    "seconds": ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")),
}
#: The colour of a finding's marks by its state.
COLOURS = {"leak": "tab:red", "remedied": "tab:red", "minor": "tab:orange", "benign": "tab:blue",
           "withdrawn": "0.5"}
#: A panel's y axis spans at least this share of its largest value, so that a flat series reads flat
#: instead of magnifying noise of a few bytes.
MIN_SPAN = 0.02


def plot_summary(summary: "PlottedSummary", path: str | os.PathLike[str]) -> None:
    """Write the summary's figure as a PNG."""
    figure(summary).savefig(path, dpi=100)


def figure(summary: "PlottedSummary") -> "Figure":
    """The figure: a title with the verdict and the steps, and one panel per series worth showing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise ImportError("the plot needs matplotlib: pip install 'leakdoctor[plot]'") from err
    names = shown(summary)
    proofs = proof_panels(summary)
    panels = len(names) + len(proofs)
    fig = Figure(figsize=(11, 1.3 + 2.3 * max(1, panels)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        _panel(ax, name, summary.series[name], summary)
    for ax, (finding, record) in zip(axes[len(names):], proofs):
        _proof_panel(ax, finding, record, summary)
    if not names:
        axes[0].text(0.5, 0.5, "no series recorded", ha="center", va="center", transform=axes[0].transAxes)
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))
    fig.suptitle(title(summary), fontsize=11)
    return fig


def title(summary: "PlottedSummary") -> str:
    """'leakdoctor: LEAK (torch, 400 steps)', with the reason when the run was not watched enough."""
    text = f"leakdoctor: {summary.verdict.upper()} ({summary.framework}, {summary.steps} steps)"
    if summary.verdict == "unwatched" and summary.unwatched:
        text += f"\n{summary.unwatched.get('reason', '')}"
    return text


def shown(summary: "PlottedSummary") -> list[str]:
    """The series that get a panel, in the summary's order: resident memory first (what the run's memory
    did, whatever else grew), then those that grow and those a finding is on; without resident memory,
    the first series at least."""
    with_points = [name for name, s in summary.series.items() if s.points]
    marked = {name for f in summary.findings for name in _proving(f, summary)}
    first = ["rss_bytes"] if "rss_bytes" in with_points else with_points[:1]
    return first + [name for name in with_points if name not in first and (
        summary.series[name].grows or name in marked)]


def _proving(f: "Finding", summary: "PlottedSummary") -> list[str]:
    """The series that proved a finding (its metric, and the hooks, compiles, live arrays or a container's
    length it explains), each on its own panel with the finding's marks."""
    return proving(f, summary.series)


def _panel(ax: "Axes", name: str, s: "SeriesSummary", summary: "PlottedSummary") -> None:
    """One series with its marks, y axis in human units (whole numbers for a count), and a legend of
    every mark beside it."""
    from matplotlib.ticker import MaxNLocator

    steps, raw = zip(*s.points)
    scale, suffix = unit_of(s.unit, raw)
    values = [v / scale for v in raw]  # plotted in the unit, so that the ticks fall on round numbers of it
    ax.plot(steps, values, lw=1.2, color="tab:purple", label=f"{name} ({s.trend_text})", zorder=3)
    warmup = summary.settings.get("warmup")
    if warmup:
        ax.axvspan(0, warmup, color="0.9", lw=0, zorder=0, label=f"warm-up: steps 0-{warmup}, not judged")
    for finding in summary.findings:
        if name in _proving(finding, summary):
            _marks(ax, finding, s.unit, steps[-1])
    _run_marks(ax, summary)
    ax.yaxis.set_major_formatter(unit_formatter(suffix))
    if s.unit == "count":
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    judged = [v for step, v in zip(steps, values) if step >= (warmup or 0)] or values
    ax.set_ylim(*y_limits(judged))  # fitted to the readings after warm-up: a first-step spike runs off the top
    ax.set_title(f"{name}: {s.trend_text}", fontsize=9, loc="left")
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def proof_panels(summary: "PlottedSummary") -> list[tuple["Finding", dict[str, Any]]]:
    """What proved a finding that no series holds (its investigation's reading at the window's two ends:
    the autograd nodes a census counted), one panel each: a retained graph on flat resident memory is shown
    by the nodes that grew."""
    return [(f, record) for f in summary.findings for record in f.proof if len(record.get("points") or []) >= 2]


def _proof_panel(ax: "Axes", f: "Finding", record: dict[str, Any], summary: "PlottedSummary") -> None:
    """One proof record: its readings, with the finding's marks and the run's."""
    from matplotlib.ticker import MaxNLocator

    unit = record.get("unit", "count")
    steps, raw = zip(*record["points"])
    scale, suffix = unit_of(unit, raw)
    values = [v / scale for v in raw]
    name = record.get("name", "proof")
    ax.plot(steps, values, lw=1.2, marker="o", color="tab:purple", zorder=3,
            label=f"{name}, read by the investigation of {f.cause}")
    _marks(ax, f, unit, int(max(summary.steps, steps[-1])))
    _run_marks(ax, summary)
    ax.yaxis.set_major_formatter(unit_formatter(suffix))
    if unit == "count":
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(*y_limits(values))
    ax.set_title(f"{name}: proves {f.cause}", fontsize=9, loc="left")
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


#: At most this many calls are marked (a Keras run's fit/evaluate/predict calls on its clock of batches).
MARKED_CALLS = 60


def _run_marks(ax: "Axes", summary: "PlottedSummary") -> None:
    """The run's own marks on every panel: where on_limit stopped it, and where each call ended (a Keras
    run, whose steps are the batches of several calls)."""
    if summary.stopped and isinstance(summary.stopped.get("step"), int):
        ax.axvline(summary.stopped["step"], color="black", ls="-", lw=1.6, zorder=6,
                   label=f"stopped before the memory limit (step {summary.stopped['step']})")
    calls = summary.calls or []
    if 1 < len(calls) <= MARKED_CALLS:
        for n, call in enumerate(calls):
            ax.axvline(call["last_step"], color="0.6", ls="-", lw=0.6, zorder=2,
                       label="end of each fit/evaluate/predict call" if n == 0 else None)


def _marks(ax: "Axes", f: "Finding", unit: str, last: int) -> None:
    """A finding's marks: dotted at the growth's onset, dashed at its detection (drawn on top), and the
    span from the remedy to the end of the run shaded green (hatched where the remedy did not work)."""
    colour, state = COLOURS.get(f.final_state, "tab:red"), f.final_state
    ax.axvline(f.first_step, color=colour, ls=":", lw=1.2, zorder=4, label=f"{f.cause}: growth began (step {f.first_step})")
    ax.axvline(f.detected_step, color=colour, ls="--", lw=1.4, zorder=5,
               label=f"{f.cause}: {'suspected' if state == 'withdrawn' else 'detected'} (step {f.detected_step})")
    remedy = f.remedy
    if remedy is not None:
        worked = {True: "effective", False: "did not work", None: "not judged"}[remedy.effective]
        after = f", then {_rate(remedy.rate_after, unit)}/step" if remedy.rate_after is not None else ""
        ax.axvspan(remedy.applied_step, max(last, remedy.applied_step + 1), color="tab:green", alpha=0.12, lw=0,
                   zorder=1, hatch=None if remedy.effective else "//",
                   label=f"after {remedy.name} (step {remedy.applied_step}): {worked}{after}")


def unit_of(unit: str, values: Sequence[float]) -> tuple[float, str]:
    """The scale and suffix a series reads best in: the largest unit its biggest value fills."""
    ladder = UNITS.get(unit)
    if not ladder:
        return 1.0, ""
    top = max((abs(v) for v in values), default=0.0)
    for size, suffix in ladder:
        if top >= size:
            return size, suffix
    return ladder[-1]


def unit_formatter(suffix: str) -> Any:
    """A matplotlib tick formatter for values already in their unit: the fewest decimals that tell the
    ticks apart exactly, then the suffix ('310 MiB', '1.25 GiB', '4.5 ms'); never an offset or a power
    of ten."""
    from matplotlib.ticker import Formatter

    class UnitFormatter(Formatter):  # type: ignore[misc]
        decimals = 0

        def set_locs(self, locs: Sequence[float]) -> None:
            super().set_locs(locs)
            self.decimals = max((decimals(x) for x in locs), default=0)

        def __call__(self, x: float, pos: int | None = None) -> str:
            text = f"{x:,.{self.decimals}f}"
            return f"{text} {suffix}" if suffix else text

    return UnitFormatter()


def decimals(x: float, most: int = 6) -> int:
    """The decimals that write `x` exactly (to a part in a million of it), at most `most`."""
    for places in range(most):
        if abs(round(x, places) - x) <= 1e-6 * max(1.0, abs(x)):
            return places
    return most


def y_limits(values: Sequence[float]) -> tuple[float, float]:
    """The y range: the data with a margin, at least MIN_SPAN of its largest magnitude wide."""
    low, high = min(values), max(values)
    span = max(high - low, MIN_SPAN * max(abs(low), abs(high))) or 1.0  # all zero: -0.55 to 0.55
    middle = (low + high) / 2
    return middle - 0.55 * span, middle + 0.55 * span


def _rate(value: float, unit: str) -> str:
    """A rate per step in the series' unit, short: '1.2 MiB', '0 B', '3'."""
    scale, suffix = unit_of(unit, [value])
    text = f"{value / scale:.3g}"
    return f"{text} {suffix}" if suffix else text
