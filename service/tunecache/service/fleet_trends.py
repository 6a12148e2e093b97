"""What the fleet's pictures show, read from pod reports and runs (table ``pod_reports``,
``tuning_runs``): the hit rate over time and the boot seconds saved by warm boots.

* :func:`hit_rate_over_time`: the window cut into :data:`BUCKETS` equal buckets; in each,
  pod boots by outcome (a boot counts once, :func:`tunecache.service.reports.boots`), for
  the whole fleet and for up to :data:`MAX_TREND_KEYS` keys named by the caller. Two
  queries, each grouped in the database (at most ``BUCKETS x 3`` rows for the fleet, ``x
  keys`` for the keys), read from the index ``(received_at, key_hash, outcome, boot_id)``.
* :func:`boot_seconds_saved`: warm boots (glossary: "Warm boot"): ``installed`` reports whose
  attestation (:attr:`tunecache.contract.PodReportCreate.compiled`) counts nothing compiled
  (``compiled_total = 0``, at the floor). Each saved the run's cold tuning, the sum of the
  seconds of the stages the tuner ran for it (``summary.stages.<stage>.seconds``), less the
  seconds it spent installing (``install_seconds``, its average in the group). Grouped by
  key and installed run in the database, the :data:`MAX_SAVING_GROUPS` groups with the most
  boots kept; then one read of those runs' summaries. A run that recorded no stage time (a
  pushed file) has no cold tuning to count against: its warm boots are counted apart.

Every read is bounded by the window (``since``), its buckets and row limits, whatever the
number of reports. Functions take the caller's session and never commit.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from tunecache.contract import ReportOutcome
from tunecache.service.models import PodReport, TuningRun

#: Buckets the window is cut into.
BUCKETS = 24
#: Keys whose own hit rate is drawn at most.
MAX_TREND_KEYS = 6
#: (key, run) groups of warm boots read at most (those with the most boots).
MAX_SAVING_GROUPS = 200

_INSTALLED = ReportOutcome.INSTALLED.value


@dataclass
class HitRateBucket:
    """Pod boots of one bucket ``[start, end)`` by outcome."""

    start: dt.datetime
    end: dt.datetime
    boots: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.boots.values())

    @property
    def hit_rate(self) -> float | None:
        """Installed boots over all boots (``None``: no boot in the bucket)."""
        return self.boots.get(_INSTALLED, 0) / self.total if self.total else None


@dataclass
class HitRateTrend:
    """The fleet's buckets and each named key's (by key hash), oldest first."""

    fleet: list[HitRateBucket]
    keys: dict[str, list[HitRateBucket]]


def _edges(since: dt.datetime, until: dt.datetime, buckets: int) -> list[dt.datetime]:
    step = (until - since) / buckets
    return [since + step * i for i in range(buckets + 1)]


def _bucketed(since: dt.datetime, edges: list[dt.datetime]):
    """Report rows of ``[since, until)`` with their bucket's number (``bucket``)."""
    bucket = case(*((PodReport.received_at < edge, i) for i, edge in enumerate(edges[1:-1])), else_=len(edges) - 2)
    return (select(bucket.label("bucket"), PodReport.key_hash, PodReport.outcome, PodReport.boot_id)
            .where(PodReport.received_at >= since, PodReport.received_at < edges[-1]))


def _boots(rows):
    """:func:`tunecache.service.reports.boots` over a subquery's columns."""
    return func.count(rows.c.boot_id.distinct()) + func.count() - func.count(rows.c.boot_id)


def hit_rate_over_time(session: Session, since: dt.datetime, until: dt.datetime, key_hashes: list[str],
                       buckets: int = BUCKETS) -> HitRateTrend:
    """Pod boots by outcome in each of ``buckets`` equal parts of ``[since, until)``: the
    fleet's, and each of the first :data:`MAX_TREND_KEYS` of ``key_hashes`` (two queries)."""
    edges = _edges(since, until, buckets)
    chosen = list(dict.fromkeys(key_hashes))[:MAX_TREND_KEYS]
    rows = _bucketed(since, edges).subquery()
    fleet = [HitRateBucket(edges[i], edges[i + 1]) for i in range(buckets)]
    for bucket, outcome, count in session.execute(
            select(rows.c.bucket, rows.c.outcome, _boots(rows)).group_by(rows.c.bucket, rows.c.outcome)):
        fleet[int(bucket)].boots[outcome] = int(count)
    keys = {h: [HitRateBucket(edges[i], edges[i + 1]) for i in range(buckets)] for h in chosen}
    if chosen:
        rows = _bucketed(since, edges).where(PodReport.key_hash.in_(chosen)).subquery()
        for bucket, key_hash, outcome, count in session.execute(
                select(rows.c.bucket, rows.c.key_hash, rows.c.outcome, _boots(rows))
                .group_by(rows.c.bucket, rows.c.key_hash, rows.c.outcome)):
            keys[key_hash][int(bucket)].boots[outcome] = int(count)
    return HitRateTrend(fleet=fleet, keys=keys)


def cold_seconds(summary: Any) -> float | None:
    """A run's cold tuning: the sum of ``summary.stages.<stage>.seconds`` (finite, >= 0) of
    the stages that recorded one; ``None`` when none did (a pushed file)."""
    stages = summary.get("stages") if isinstance(summary, dict) else None
    if not isinstance(stages, dict):
        return None
    found = [record.get("seconds") for record in stages.values() if isinstance(record, dict)]
    found = [s for s in found if isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s >= 0]
    return float(sum(found)) if found else None


@dataclass
class KeySaving:
    """A key's warm boots in the window and the seconds they saved (see the module)."""

    key_hash: str
    warm_boots: int = 0
    seconds_saved: float = 0.0
    runs: list[int] = field(default_factory=list)
    without_cold_time: int = 0
    """Warm boots of runs that recorded no stage time (not counted in ``seconds_saved``)."""


def warm_boot_groups(since: dt.datetime):
    """``(key_hash, run_id, boots, average install_seconds)`` of warm boots since ``since``,
    most boots first, at most :data:`MAX_SAVING_GROUPS`."""
    boots = func.count(PodReport.boot_id.distinct()) + func.count() - func.count(PodReport.boot_id)
    return (select(PodReport.key_hash, PodReport.run_id, boots.label("boots"), func.avg(PodReport.install_seconds))
            .where(PodReport.received_at >= since, PodReport.outcome == _INSTALLED, PodReport.compiled_total == 0,
                   PodReport.run_id.is_not(None))
            .group_by(PodReport.key_hash, PodReport.run_id)
            .order_by(boots.desc(), PodReport.key_hash, PodReport.run_id)
            .limit(MAX_SAVING_GROUPS))


def boot_seconds_saved(session: Session, since: dt.datetime) -> list[KeySaving]:
    """Each key's warm boots since ``since`` and the boot seconds they saved against the
    cold tuning of the run they installed (see the module), most seconds saved first. Two
    queries."""
    groups = session.execute(warm_boot_groups(since)).all()
    run_ids = sorted({run_id for _, run_id, _, _ in groups})
    cold = {run_id: cold_seconds(summary) for run_id, summary in
            session.execute(select(TuningRun.id, TuningRun.summary).where(TuningRun.id.in_(run_ids)))} if run_ids else {}
    savings: dict[str, KeySaving] = {}
    for key_hash, run_id, boots, install in groups:
        saving = savings.setdefault(key_hash, KeySaving(key_hash))
        saving.warm_boots += int(boots)
        saving.runs.append(run_id)
        seconds = cold.get(run_id)
        if seconds is None:
            saving.without_cold_time += int(boots)
        else:
            saving.seconds_saved += int(boots) * max(0.0, seconds - float(install or 0.0))
    return sorted(savings.values(), key=lambda s: (-s.seconds_saved, -s.warm_boots, s.key_hash))

