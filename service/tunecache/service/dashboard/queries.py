"""The dashboard's one query of its own: a page of pod reports, newest first. Everything
else it shows comes from the API's functions (:mod:`~tunecache.service.repository`,
:mod:`~tunecache.service.jobs`, :mod:`~tunecache.service.reports`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from tunecache.contract import TuningKey, encode_run_cursor
from tunecache.service.models import PodReport


@dataclass
class ReportRow:
    """One pod report as the reports page shows it."""

    id: int
    received_at: dt.datetime
    key: TuningKey
    key_hash: str
    environment_hash: str
    outcome: str
    run_id: int | None
    differences: list[dict]
    error_kind: str | None
    install_seconds: float | None
    jit_modules: int | None
    jit_skipped: int | None
    pod: str
    rank: int | None
    source: str
    looked_up: bool | None


@dataclass
class ReportPage:
    """Up to ``limit`` reports, and the cursor of the next page (``None``: the last)."""

    items: list[ReportRow]
    next_cursor: str | None


def reports_page_query(after: tuple[dt.datetime, int] | None, limit: int, outcome: str | None = None,
                       key_hash: str | None = None) -> Select:
    """``SELECT`` of up to ``limit`` reports newest first (``received_at``, then ``id``) from
    after the report ``after`` (``(received_at, id)``: a cursor), optionally of one
    ``outcome`` and one key. Ordered and bounded by the index ``(received_at, key_hash,
    outcome)``, or ``(outcome, received_at, ...)`` with an outcome; the cursor's
    ``received_at <= t`` bounds the index scan (the ``id`` only breaks ties)."""
    query = select(PodReport)
    if outcome is not None:
        query = query.where(PodReport.outcome == outcome)
    if key_hash is not None:
        query = query.where(PodReport.key_hash == key_hash)
    if after is not None:
        at, report_id = after
        query = query.where(PodReport.received_at <= at,
                            or_(PodReport.received_at < at, and_(PodReport.received_at == at, PodReport.id < report_id)))
    return query.order_by(PodReport.received_at.desc(), PodReport.id.desc()).limit(limit)


def reports_page(session: Session, *, after: tuple[dt.datetime, int] | None, limit: int, outcome: str | None = None,
                 key_hash: str | None = None) -> ReportPage:
    """One page of :func:`reports_page_query` (one query) and the cursor of the next."""
    rows = list(session.scalars(reports_page_query(after, limit + 1, outcome, key_hash)))
    more, rows = len(rows) > limit, rows[:limit]
    items = [ReportRow(id=r.id, received_at=r.received_at, key=TuningKey.model_validate(r), key_hash=r.key_hash,
                       environment_hash=r.environment_hash, outcome=r.outcome, run_id=r.run_id,
                       differences=list(r.differences or []), error_kind=r.error_kind, install_seconds=r.install_seconds,
                       jit_modules=r.jit_modules, jit_skipped=r.jit_skipped, pod=r.pod, rank=r.rank, source=r.source,
                       looked_up=r.looked_up)
             for r in rows]
    return ReportPage(items=items, next_cursor=encode_run_cursor(rows[-1].received_at, rows[-1].id) if more and rows else None)
