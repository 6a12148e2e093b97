"""The history page's chart, drawn on the server as inline SVG (no script): tuning time per
stage over time for one key, from each run's ``summary.stages.<stage>.seconds`` (what the
tuner's child records for a stage that ran: ``{"status": "done", "seconds": ...}``).

:func:`stage_chart` computes every coordinate; the template only writes them out. Values
that are not finite numbers (a pod may push any summary) are left out; stage names are
text like any other and escaped by the template.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tunecache.contract import TuningRunRead
from tunecache.service.dashboard.charts import nice_ceiling

#: Size of the drawing (SVG user units) and its margins.
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 16, 36
#: The most stages one chart draws (a legend entry each).
MAX_SERIES = 10
#: Colours of the series, in order (fixed: never from the data).
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass
class Point:
    """One stage of one run: where it is drawn and what it says."""

    x: float
    y: float
    run_id: int
    seconds: float
    created_at: dt.datetime


@dataclass
class Series:
    """A stage's points, oldest first, with its colour and its legend's place."""

    stage: str
    colour: str
    points: list[Point] = field(default_factory=list)
    legend_y: float = 0.0

    @property
    def polyline(self) -> str:
        """The ``points`` attribute of the line through the series."""
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


@dataclass
class Chart:
    """What the template draws: series, axis ticks ``(position, label)`` and the plot box."""

    series: list[Series]
    y_ticks: list[tuple[float, str]]
    x_ticks: list[tuple[float, str]]
    runs: int
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    plot_right: int = WIDTH - RIGHT
    plot_bottom: int = HEIGHT - BOTTOM

    @property
    def points(self) -> int:
        """How many points are drawn."""
        return sum(len(s.points) for s in self.series)


def stage_seconds(summary: dict[str, Any]) -> dict[str, float]:
    """``{stage: seconds}`` of a run's ``summary.stages`` (stages that ran and recorded a
    finite, non-negative time)."""
    stages = summary.get("stages") if isinstance(summary, dict) else None
    found: dict[str, float] = {}
    if not isinstance(stages, dict):
        return found
    for stage, record in stages.items():
        seconds = record.get("seconds") if isinstance(record, dict) else None
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) and seconds >= 0:
            found[str(stage)] = float(seconds)
    return found


def stage_chart(runs: Iterable[TuningRunRead]) -> Chart | None:
    """The chart of ``runs`` (any order): x = when each run was recorded, y = seconds, one
    series per stage (the first :data:`MAX_SERIES` stages by name); ``None`` when no run
    recorded a stage time."""
    timed = sorted(((run, stage_seconds(run.summary)) for run in runs), key=lambda rs: (rs[0].created_at, rs[0].id))
    timed = [(run, stages) for run, stages in timed if stages]
    if not timed:
        return None
    names = sorted({stage for _, stages in timed for stage in stages})[:MAX_SERIES]
    top = nice_ceiling(max(seconds for _, stages in timed for stage, seconds in stages.items() if stage in names))
    first, last = timed[0][0].created_at, timed[-1][0].created_at
    span = (last - first).total_seconds()
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(when: dt.datetime) -> float:
        return LEFT + (plot_w / 2 if span <= 0 else plot_w * (when - first).total_seconds() / span)

    def y_of(seconds: float) -> float:
        return TOP + plot_h * (1 - seconds / top)

    series = [Series(stage=name, colour=PALETTE[i % len(PALETTE)], legend_y=TOP + 14 + 18 * i) for i, name in enumerate(names)]
    by_name = {s.stage: s for s in series}
    for run, stages in timed:
        for stage, seconds in stages.items():
            if stage in by_name:
                by_name[stage].points.append(Point(x=x_of(run.created_at), y=y_of(seconds), run_id=run.id, seconds=seconds,
                                                   created_at=run.created_at))
    y_ticks = [(y_of(top * f), f"{top * f:g} s") for f in (0, 0.25, 0.5, 0.75, 1)]
    fmt = "%Y-%m-%d %H:%M" if span >= 7200 else "%Y-%m-%d %H:%M:%S"  # runs close together: their seconds differ
    x_ticks = [(x_of(first), first.astimezone(dt.timezone.utc).strftime(fmt))]
    if span > 0:
        x_ticks.append((x_of(last), last.astimezone(dt.timezone.utc).strftime(fmt)))
    return Chart(series=series, y_ticks=y_ticks, x_ticks=x_ticks, runs=len(timed))
