"""What each page draws (:mod:`~tunecache.service.dashboard.charts`), from what the
service's functions read:

* the fleet page (:func:`fleet_figures`): the hit rate over the window, the fleet's and the
  busiest keys' of the page (:func:`tunecache.service.fleet_trends.hit_rate_over_time`);
  boot seconds saved by warm boots per key (:func:`tunecache.service.fleet_trends.boot_seconds_saved`);
  the wanted engine variants by boots that found no warm state (the fleet view's
  ``wanted_variants``);
* a key's history (:func:`history_figures`): tuning time and entries per run;
* a job (:func:`job_figure`): the seconds of each stage its run recorded.

Each figure is ``None`` when there is nothing to draw; the page then says why in words.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session

from tunecache.contract import KEY_FIELDS, FleetView, RunTrigger, TuningKey, TuningRunRead
from tunecache.service import fleet_trends, reports
from tunecache.service.dashboard.chart import stage_seconds
from tunecache.service.dashboard.charts import Bar, LineSeries, bar_chart, line_chart

#: Bars of the boot-seconds-saved chart (the keys that saved most).
SAVING_BARS = 10


def key_label(key: TuningKey) -> str:
    """A key in a few words: ``model (max tokens, tp/dp/ep)``."""
    return (f"{key.model} ({key.max_num_batched_tokens}, "
            f"{key.tensor_parallel_size}/{key.data_parallel_size}/{key.expert_parallel_size})")


def seconds_text(value: float) -> str:
    """Seconds in words for an axis or a bar: ``42 s``, ``1.5 h``."""
    if value >= 7200:
        return f"{value / 3600:.3g} h"
    if value >= 120:
        return f"{value / 60:.3g} min"
    return f"{value:.3g} s"


def _stamp(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).strftime("%m-%d %H:%M")


@dataclass
class FleetFigures:
    """The fleet page's pictures and what they were drawn from."""

    hit_rate: Markup | None
    saved: Markup | None
    variants: Markup | None
    warm_boots: int
    seconds_saved: float
    without_cold_time: int


def _key_names(session: Session, view: FleetView, since: dt.datetime, hashes: list[str]) -> dict[str, TuningKey]:
    """The keys of ``hashes``: those on the page, the others from their latest report (one
    query, only for hashes not on the page)."""
    known = {row.key.key_hash(): row.key for row in view.keys}
    unknown = [h for h in hashes if h not in known]
    if unknown:
        for key_hash, *values in session.execute(reports.report_keys(since, unknown)):
            known[key_hash] = TuningKey.model_validate(dict(zip(KEY_FIELDS, values)))
    return known


def fleet_figures(session: Session, view: FleetView) -> FleetFigures:
    """The fleet page's three pictures over ``view``'s window (see the module): a bounded
    number of queries whatever the number of reports."""
    since, until = view.since, view.generated_at
    busiest = [row.key.key_hash() for row in view.keys if row.reports][:fleet_trends.MAX_TREND_KEYS]
    trend = fleet_trends.hit_rate_over_time(session, since, until, busiest)
    names = {row.key.key_hash(): row.key for row in view.keys}

    def series(name: str, buckets: list[fleet_trends.HitRateBucket]) -> LineSeries:
        kept = [b for b in buckets if b.hit_rate is not None]
        return LineSeries(name=name,
                          points=[(((b.start - since) + (b.end - b.start) / 2).total_seconds() / 3600, b.hit_rate * 100)
                                  for b in kept],
                          labels=[f"{_stamp(b.start)} to {_stamp(b.end)} UTC, {b.total} boots" for b in kept])

    lines = [series("fleet", trend.fleet)] + [series(key_label(names[h]), trend.keys[h]) for h in busiest]
    span_h = (until - since).total_seconds() / 3600
    hit_rate = line_chart("hit-rate-chart", "hit rate over time, percent of pod boots that installed a run", lines,
                          y_format=lambda v: f"{v:.0f} %", y_max=100.0, x_range=(0.0, span_h),
                          x_ticks=[(0.0, f"{_stamp(since)} UTC"), (span_h / 2, f"{span_h / 2:g} h ago"),
                                   (span_h, f"{_stamp(until)} UTC")])

    savings = fleet_trends.boot_seconds_saved(session, since)
    shown = [s for s in savings if s.seconds_saved > 0][:SAVING_BARS]
    keys = _key_names(session, view, since, [s.key_hash for s in shown])
    saved = bar_chart("saved-chart", "boot seconds saved by warm boots, per key", [
        Bar(label=key_label(keys[s.key_hash]) if s.key_hash in keys else s.key_hash[:12], value=round(s.seconds_saved, 3),
            title=f"{keys[s.key_hash].model if s.key_hash in keys else s.key_hash}: {seconds_text(s.seconds_saved)} saved "
                  f"by {s.warm_boots} warm boot(s) of run(s) {', '.join(map(str, s.runs))}")
        for s in shown], value_format=seconds_text)

    variants = bar_chart("variants-chart", "wanted engine variants, boots that found no warm state", [
        Bar(label=f"{v.key.model if v.key else '?'} · {v.variant[:8]}", value=v.missing,
            title=f"{v.key.model if v.key else '?'}, variant {v.variant}: {v.missing} of {v.boots} boots found no warm "
                  f"state ({v.pods} pods)")
        for v in view.wanted_variants], value_format=lambda v: f"{v:.0f} boots")
    return FleetFigures(hit_rate=hit_rate, saved=saved, variants=variants,
                        warm_boots=sum(s.warm_boots for s in savings),
                        seconds_saved=sum(s.seconds_saved for s in savings),
                        without_cold_time=sum(s.without_cold_time for s in savings))


def tuning_seconds(run: TuningRunRead) -> float | None:
    """A run's tuning time: the tuner's ``summary.tuning_seconds``, else the sum of its
    stages' seconds; ``None`` for neither (a pushed file)."""
    value = run.summary.get("tuning_seconds")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return fleet_trends.cold_seconds(run.summary)


def is_pushed(run: TuningRunRead) -> bool:
    """Whether the run is a file pushed as it was (``tunecache push``: trigger ``upload``,
    or a pod's ``pod``): a tuner did not run, so it has no stages."""
    return run.trigger in (RunTrigger.UPLOAD, RunTrigger.POD)


def history_figures(runs: Sequence[TuningRunRead]) -> dict[str, Any]:
    """Tuning time and entries per run of ``runs`` (one key's, any order), oldest first; the
    x axis is the run's place in that order, each point labelled with its run. With them:
    ``pushed_runs``, the pushed runs among them that recorded no stage (the stage chart
    draws nothing of them), and ``all_pushed``: every run is one."""
    ordered = sorted(runs, key=lambda r: (r.created_at, r.id))
    timed = [(i, r, tuning_seconds(r)) for i, r in enumerate(ordered)]
    timed = [(i, r, s) for i, r, s in timed if s is not None]
    counted = [(i, r) for i, r in enumerate(ordered) if r.entries is not None]
    ticks = [(0, f"run {ordered[0].id}")] + ([(len(ordered) - 1, f"run {ordered[-1].id}")] if len(ordered) > 1 else []) \
        if ordered else []
    tuning = line_chart("tuning-time-chart", "tuning seconds per run", [LineSeries(
        name="tuning time", points=[(i, s) for i, _, s in timed],
        labels=[f"run {r.id}, {r.created_at:%Y-%m-%d %H:%M}" for _, r, _ in timed])],
        y_format=seconds_text, x_ticks=ticks)
    entries = line_chart("entries-chart", "entries per run", [LineSeries(
        name="entries", points=[(i, r.entries) for i, r in counted],
        labels=[f"run {r.id}, {r.created_at:%Y-%m-%d %H:%M}" for _, r in counted])],
        y_format=lambda v: f"{v:g}", x_ticks=ticks)
    unstaged = [r for r in ordered if not stage_seconds(r.summary)]
    pushed = [r for r in unstaged if is_pushed(r)]
    return {"tuning_chart": tuning, "entries_chart": entries, "pushed_runs": len(pushed),
            "all_pushed": bool(ordered) and len(pushed) == len(ordered)}


def job_figure(run: TuningRunRead | None) -> Markup | None:
    """The seconds of each stage ``run`` (a job's) recorded, in the tuner's order."""
    if run is None:
        return None
    stages = stage_seconds(run.summary)
    return bar_chart("job-stages-chart", f"seconds per stage of run {run.id}",
                     [Bar(label=name, value=seconds) for name, seconds in stages.items()], value_format=seconds_text)
