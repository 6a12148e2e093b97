"""Automatic tunings refused, kept for the fleet view (table ``auto_tune_refusals``).

Every time :mod:`tunecache.service.variant_autotune` does not queue a variant it looked at
(fewer distinct tokens than it needs, a budget spent, ...; the reasons are
:data:`tunecache.contract.AUTO_TUNE_REFUSALS`), it counts it in
``tunecache_auto_tune_refused_total{reason}`` (this process's) and here (every process's,
every replica's): one row per hour, key hash, variant and reason, its count added to by
one upsert (:func:`tunecache.service.dialect.upsert_add`). The fleet view
(:func:`refusals_since`) sums the hours of its window. Rows are bounded by the variants
reported with a token (an anonymous report is never one: it is counted in the metric only)
and deleted with the reports (:func:`prune`, ``TUNECACHE_REPORT_RETENTION_DAYS``).
Functions take the caller's session and never commit.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.orm import Session

from tunecache.service import dialect, metrics
from tunecache.service.models import AutoTuneRefusal, utcnow


def hour_of(at: dt.datetime) -> dt.datetime:
    """The start of the hour ``at`` is in."""
    return at.replace(minute=0, second=0, microsecond=0)


def record(session: Session, key_hash: str, variant: str, reason: str, at: dt.datetime | None = None) -> None:
    """Count one refusal of the variant's automatic tuning, here and in the metric."""
    metrics.auto_tune_refused(reason)
    at = at or utcnow()
    dialect.upsert_add(session, AutoTuneRefusal.__table__,
                       {"hour": hour_of(at), "key_hash": key_hash, "variant": variant, "reason": reason, "count": 1,
                        "last_at": at},
                       conflict=["hour", "key_hash", "variant", "reason"], add="count")


def refusals_since(connection: Connection, since: dt.datetime) -> dict[tuple[str, str], dict[str, int]]:
    """``(key hash, variant)`` -> reason -> refusals, of the hours that end after ``since``
    (the hour ``since`` is in counts whole)."""
    found: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for key_hash, variant, reason, count in connection.execute(
            select(AutoTuneRefusal.key_hash, AutoTuneRefusal.variant, AutoTuneRefusal.reason,
                   func.sum(AutoTuneRefusal.count))
            .where(AutoTuneRefusal.hour >= hour_of(since))
            .group_by(AutoTuneRefusal.key_hash, AutoTuneRefusal.variant, AutoTuneRefusal.reason)):
        found[(key_hash, variant)][reason] = int(count)
    return dict(found)


def totals(refused: dict[tuple[str, str], dict[str, int]]) -> dict[str, int]:
    """Reason -> refusals, of every variant of ``refused`` (:func:`refusals_since`)."""
    summed: dict[str, int] = defaultdict(int)
    for by_reason in refused.values():
        for reason, count in by_reason.items():
            summed[reason] += count
    return dict(summed)


def prune(session: Session, older_than: dt.datetime) -> int:
    """Delete the refusals last counted before ``older_than``; returns how many rows."""
    return session.execute(delete(AutoTuneRefusal).where(AutoTuneRefusal.last_at < older_than)).rowcount or 0
