"""A PNG of every series with the detection and remedy steps marked (the [plot] extra: matplotlib).
Uses matplotlib's object API without pyplot, so no global backend or figure state is touched."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leakdoctor.summary import Summary

_SCALE = {"bytes": (2**20, "MiB"), "seconds": (1e-3, "ms"), "count": (1, "")}


def plot_summary(summary: "Summary", path: str | os.PathLike[str]) -> None:
    """One panel per series; dotted: growth onset, dashed: detection, solid green: remedy applied."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("the plot needs matplotlib: pip install 'leakdoctor[plot]'") from err
    series = {name: s for name, s in summary.series.items() if s.points}
    fig = Figure(figsize=(9, 1.0 + 2.0 * max(1, len(series))))
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, len(series)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, s) in zip(axes, series.items()):
        scale, label = _SCALE.get(s.unit, (1, ""))
        steps, values = zip(*s.points)
        ax.plot(steps, [v / scale for v in values], lw=1.2)
        ax.set_ylabel(f"{name}" + (f"\n({label})" if label else ""), fontsize=8)
        ax.set_title(f"{name}: {s.trend}", fontsize=8, loc="left")
        warmup = summary.settings.get("warmup")
        if warmup:
            ax.axvspan(0, warmup, color="0.9", lw=0)
        for finding in summary.findings:
            if finding.metric != name:
                continue
            color = "tab:blue" if finding.benign else "tab:red"
            ax.axvline(finding.first_step, color=color, ls=":", lw=1)
            ax.axvline(finding.detected_step, color=color, ls="--", lw=1, label=f"{finding.cause} detected")
            if finding.remedy:
                ax.axvline(finding.remedy.applied_step, color="tab:green", lw=1.5, label=f"{finding.remedy.name} applied")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("step")
    fig.suptitle(f"leakdoctor: {summary.framework}, {summary.steps} steps, {summary.verdict}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
