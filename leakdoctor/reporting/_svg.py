"""One series drawn as an inline SVG chart for the HTML report (_html.py): its readings as a line, the warm-up
shaded, and marks at given steps (a growth's onset, its detection, a remedy's span, a stop), each named in a
legend under the chart, on axes in steps and in the series' unit (MiB, ms, counts). Plain strings, no
library: the report stays one self-contained file with nothing to install."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Sequence

from leakdoctor.reporting.loading import clean
from leakdoctor.reporting._plot import decimals, unit_of, y_limits

__all__ = ["Mark", "chart", "nice_ticks", "text"]

WIDTH, HEIGHT = 720, 200
#: The plot area inside the chart: left margin for the value ticks, bottom for the step ticks.
LEFT, RIGHT, TOP, BOTTOM = 78, 12, 10, 26
TICKS = 6


@dataclass(frozen=True)
class Mark:
    """A mark on a chart: a vertical line at `step` (`until`: a band from `step` to `until`); `kind` is its
    CSS class and data-mark (onset, detected, remedy, remedy-failed, stopped), `label` its legend entry."""

    kind: str
    step: float
    label: str
    until: float | None = None


def text(value: object) -> str:
    """`value` as text safe in an element or an attribute: control characters dropped, markup escaped."""
    return html.escape(clean(str(value)), quote=True)


def chart(name: str, unit: str, points: Sequence[Sequence[float | None]], marks: Sequence[Mark] = (),
          warmup: int = 0, last_step: float | None = None, caption: str = "") -> str:
    """A <figure> holding the SVG of one series and its legend (data-series: its name; data-points: the
    readings drawn). Readings that are null are left out; a series with none reads 'no readings'."""
    drawn = [(float(s), float(v)) for s, v in points if v is not None and math.isfinite(v) and math.isfinite(s)]
    head = f'<figure class="chart" data-series="{text(name)}" data-points="{len(drawn)}">'
    tail = f"<figcaption>{text(caption or name)}</figcaption>{_legend(name, marks, warmup)}</figure>"
    if not drawn:
        return f'{head}<p class="empty">no readings of {text(name)}</p>{tail}'
    steps = [s for s, _ in drawn]
    x_max = max(steps[-1], last_step or 0.0, *(m.until or m.step for m in marks), 1.0)
    judged = [v for s, v in drawn if s >= warmup] or [v for _, v in drawn]
    low, high = y_limits(judged)
    scale = _Scale(x_max, low, high)
    parts = [_warmup(scale, warmup), *(_mark(scale, m) for m in marks), _grid(scale, unit),
             _line(scale, drawn), *(_mark_line(scale, m) for m in marks)]
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'aria-label="{text(name)} over the steps">'
           f"<title>{text(name)} ({text(unit)}) over {x_max:g} steps</title>{''.join(parts)}</svg>")
    return head + svg + tail


@dataclass(frozen=True)
class _Scale:
    """From a step and a value to the chart's coordinates."""

    x_max: float
    low: float
    high: float

    def x(self, step: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * min(max(step, 0.0), self.x_max) / self.x_max

    def y(self, value: float) -> float:
        span = (self.high - self.low) or 1.0
        share = min(max((value - self.low) / span, -0.05), 1.05)  # a first-step spike runs off the top
        return TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - share)


def _line(scale: _Scale, drawn: list[tuple[float, float]]) -> str:
    coords = " ".join(f"{scale.x(s):.1f},{scale.y(v):.1f}" for s, v in drawn)
    return f'<polyline class="series" points="{coords}"/>'


def _warmup(scale: _Scale, warmup: int) -> str:
    if warmup <= 0:
        return ""
    x0, x1 = scale.x(0), scale.x(warmup)
    return (f'<rect class="warmup" data-mark="warmup" x="{x0:.1f}" y="{TOP}" width="{x1 - x0:.1f}" '
            f'height="{HEIGHT - TOP - BOTTOM}"/>')


def _mark(scale: _Scale, mark: Mark) -> str:
    """A band under the line (a remedy's span to the end of the run); a line is drawn over it (_mark_line)."""
    if mark.until is None:
        return ""
    x0, x1 = scale.x(mark.step), scale.x(max(mark.until, mark.step))
    return (f'<rect class="band {text(mark.kind)}" x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 1.0):.1f}" '
            f'height="{HEIGHT - TOP - BOTTOM}"/>')


def _mark_line(scale: _Scale, mark: Mark) -> str:
    x = scale.x(mark.step)
    return (f'<line class="mark {text(mark.kind)}" data-mark="{text(mark.kind)}" data-step="{mark.step:g}" '
            f'x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}"><title>{text(mark.label)}</title></line>')


def _grid(scale: _Scale, unit: str) -> str:
    """The axes: value ticks in the series' unit on the left, step ticks below."""
    size, suffix = unit_of(unit, [scale.low, scale.high])
    values = nice_ticks(scale.low / size, scale.high / size)
    places = max((decimals(v) for v in values), default=0)
    parts = [f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
             f'height="{HEIGHT - TOP - BOTTOM}"/>']
    for value in values:
        y = scale.y(value * size)
        label = f"{value:,.{places}f}" + (f" {suffix}" if suffix else "")
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{text(label)}</text>')
    for step in nice_ticks(0.0, scale.x_max, integer=True):
        x = scale.x(step)
        parts.append(f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{step:g}</text>')
    return "".join(parts)


def nice_ticks(low: float, high: float, count: int = TICKS, integer: bool = False) -> list[float]:
    """About `count` round values (1, 2, 2.5 or 5 times a power of ten apart) from `low` to `high`."""
    span = high - low
    if not math.isfinite(span) or span <= 0:
        return [low] if math.isfinite(low) else []
    raw = span / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step + 1e-9) + 1)]


def _legend(name: str, marks: Sequence[Mark], warmup: int) -> str:
    items = [f'<li class="key series">{text(name)}</li>']
    if warmup > 0:
        items.append(f'<li class="key warmup">warm-up: steps 0-{warmup}, not judged</li>')
    items += [f'<li class="key {text(m.kind)}">{text(m.label)}</li>' for m in marks]
    return f'<ul class="legend">{"".join(items)}</ul>'
