"""The dashboard's pictures, drawn on the server as inline SVG (no script, no outside
resource: the pages' CSP stays ``default-src 'none'``).

Two kinds, each a function returning the ``<svg>`` element as :class:`markupsafe.Markup`:

* :func:`line_chart`: series of ``(x, y)`` points over a shared x axis (time, or a run's
  place in a history), one polyline and one circle per point;
* :func:`bar_chart`: one horizontal bar per labelled value.

Every text and attribute value that comes from data (model names, stage names, variants)
is escaped here (:func:`markupsafe.escape`); numbers are written by this module. The data a
chart was given stays on it for whoever reads the page (and for the browser tests): the
``<svg>`` carries ``data-chart`` and ``data-points`` (points or bars drawn), each series
``data-series``, each point ``data-x``/``data-y`` and each bar ``data-label``/``data-value``,
and every point and bar a ``<title>`` (the browser's tooltip).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

#: Colours of the series, in order (fixed: never from the data).
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
#: The most series a line chart draws (a legend entry each), and the most bars a bar chart.
MAX_SERIES = 10
MAX_BARS = 20
#: Characters of a legend entry or a bar's label shown (the whole text is in its ``<title>``).
LABEL_CHARS = 24


@dataclass
class LineSeries:
    """One line: its name and its ``(x, y)`` points (x: any number, e.g. seconds since the
    window's start; y: a finite value; others are left out). ``labels`` says each x in
    words for the point's tooltip (same length as ``points``, or empty)."""

    name: str
    points: list[tuple[float, float]]
    labels: list[str] = field(default_factory=list)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above ``value`` (an axis' top; 1 for none)."""
    if not _finite(value) or value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        top = step * 10 ** exponent
        if top >= value:
            return top
    return 10.0 ** (exponent + 1)


def _short(text: str, chars: int = LABEL_CHARS) -> str:
    """``text`` in at most ``chars`` characters: its start and its end about an ellipsis
    (labels that differ only at the end, as keys of one model, stay apart)."""
    if len(text) <= chars:
        return text
    head = (chars - 1) // 2
    return text[:head] + "…" + text[len(text) - (chars - 1 - head):]


def _num(value: float) -> str:
    """A value for a data attribute: as Python writes it, integers without ``.0``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _svg_open(chart_id: str, kind: str, label: str, width: int, height: int, points: int) -> str:
    return (f'<svg id="{escape(chart_id)}" class="chart" data-chart="{escape(kind)}" data-points="{points}" role="img" '
            f'aria-label="{escape(label)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{escape(label)}</title>')


def line_chart(chart_id: str, label: str, series: Sequence[LineSeries], *, y_format: Callable[[float], str] = str,
               x_ticks: Sequence[tuple[float, str]] = (), y_max: float | None = None,
               x_range: tuple[float, float] | None = None, width: int = 760, height: int = 240) -> Markup | None:
    """A line chart of ``series`` (the first :data:`MAX_SERIES` that have a point), x over
    ``x_range`` (default: from the smallest to the largest x given), y from 0 to ``y_max`` (default: a round number at or above
    the largest y); ``x_ticks``: ``(x, text)`` under the axis; ``y_format`` writes the y
    axis' ticks. ``None`` when no series has a point (the page says so in words)."""
    drawn = []
    for s in series:
        kept = [(i, (float(x), float(y))) for i, (x, y) in enumerate(s.points) if _finite(x) and _finite(y)]
        if kept:
            drawn.append((s, kept))
    drawn = drawn[:MAX_SERIES]
    if not drawn:
        return None
    left, right, top, bottom = 64, 200, 14, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for _, kept in drawn for _, (x, _) in kept]
    x0, x1 = x_range if x_range is not None and x_range[1] > x_range[0] else (min(xs), max(xs))
    y_top = y_max if y_max is not None and y_max > 0 else nice_ceiling(max(y for _, kept in drawn for _, (_, y) in kept))

    def x_of(x: float) -> float:
        return left + (plot_w / 2 if x1 <= x0 else plot_w * (x - x0) / (x1 - x0))

    def y_of(y: float) -> float:
        return top + plot_h * (1 - min(max(y, 0.0), y_top) / y_top)

    count = sum(len(kept) for _, kept in drawn)
    out = [_svg_open(chart_id, "line", label, width, height, count),
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>']
    for f in (0, 0.25, 0.5, 0.75, 1):
        y = y_of(y_top * f)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{escape(y_format(y_top * f))}</text>')
    for x, text in x_ticks:
        if _finite(x) and x0 <= x <= x1:
            out.append(f'<text x="{x_of(x):.1f}" y="{top + plot_h + 18}" text-anchor="middle" class="tick">{escape(text)}</text>')
    for n, (s, kept) in enumerate(drawn):
        colour = PALETTE[n % len(PALETTE)]
        out.append(f'<g class="series" data-series="{escape(s.name)}" data-count="{len(kept)}">')
        if len(kept) > 1:
            line = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for _, (x, y) in kept)
            out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for i, (x, y) in kept:
            said = s.labels[i] if i < len(s.labels) else _num(x)
            out.append(f'<circle class="point" cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="3" fill="{colour}" '
                       f'data-x="{_num(x)}" data-y="{_num(y)}"><title>{escape(s.name)}: {escape(y_format(y))} '
                       f'({escape(said)})</title></circle>')
        legend_y = top + 12 + 17 * n
        out.append(f'<rect x="{left + plot_w + 12}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{left + plot_w + 28}" y="{legend_y}" class="legend">{escape(_short(s.name))}</text></g>')
    out.append("</svg>")
    return Markup("".join(out))


@dataclass
class Bar:
    """One bar: its label, its value (finite, >= 0) and, optionally, its tooltip."""

    label: str
    value: float
    title: str = ""


def bar_chart(chart_id: str, label: str, bars: Sequence[Bar], *, value_format: Callable[[float], str] = str,
              width: int = 760, bar_height: int = 20) -> Markup | None:
    """A horizontal bar chart of ``bars`` (their order kept; the first :data:`MAX_BARS` with
    a finite value >= 0), each bar's value written beside it. ``None`` when there is none."""
    kept = [b for b in bars if _finite(b.value) and b.value >= 0][:MAX_BARS]
    if not kept:
        return None
    left, right, top, gap = 230, 90, 8, 6
    height = top * 2 + len(kept) * (bar_height + gap)
    top_value = nice_ceiling(max(b.value for b in kept))
    plot_w = width - left - right
    out = [_svg_open(chart_id, "bar", label, width, height, len(kept))]
    for n, b in enumerate(kept):
        y = top + n * (bar_height + gap)
        w = max(1.0, plot_w * b.value / top_value) if b.value > 0 else 0.0
        title = b.title or f"{b.label}: {value_format(b.value)}"
        out.append(f'<g class="bar" data-label="{escape(b.label)}" data-value="{_num(b.value)}">'
                   f'<title>{escape(title)}</title>'
                   f'<text x="{left - 8}" y="{y + bar_height * 0.7:.1f}" text-anchor="end" class="legend">'
                   f'{escape(_short(b.label, 30))}</text>'
                   f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_height}" fill="{PALETTE[0]}"/>'
                   f'<text x="{left + w + 6:.1f}" y="{y + bar_height * 0.7:.1f}" class="tick">{escape(value_format(b.value))}</text></g>')
    out.append("</svg>")
    return Markup("".join(out))
