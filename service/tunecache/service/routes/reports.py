"""``/v1/reports``: pods say what each install came to; ``/v1/fleet``: the fleet view from it.

Who may report: the ``read`` policy (anyone, unless ``TUNECACHE_READ_TOKEN_REQUIRED``, then
a token of any scope). Pods hold a read token or none, and a report is a small write that
decides nothing: it never chooses a path, a key row, a tuning or a token, is never read
back by a pod, and only feeds counts (the fleet view, ``tunecache_pod_*`` metrics). What
keeps it cheap and bounded instead of a token scope: a body of at most
:data:`~tunecache.contract.MAX_REPORT_BYTES`, ``TUNECACHE_REPORT_RATE`` reports per client
address and token per process (429 past it), at most a quarter of the process's database
threads inserting reports at once (the others wait without holding a thread, so lookups
that miss the cache always find threads), one short insert per report, and retention
(``TUNECACHE_REPORT_RETENTION_DAYS``). Reports are not audited (they are not writes to
tunings; a boot storm would flood the audit log).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, BackgroundTasks, HTTPException, Query, Request, Response
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import MAX_REPORT_BYTES, ErrorBody, FleetView, PodReportCreate
from tunecache.service import metrics, reports
from tunecache.service.deps import SessionDep
from tunecache.service.models import utcnow
from tunecache.service.policy import ReadCaller

log = logging.getLogger("tunecache")

router = APIRouter(prefix="/reports", tags=["fleet"])


@router.post(
    "",
    status_code=204,
    response_class=Response,
    responses={
        413: {"model": ErrorBody, "description": f"The report is over {MAX_REPORT_BYTES} bytes"},
        429: {"model": ErrorBody, "description": "Too many reports from this address and token (Retry-After)"},
    },
)
async def report_install(body: PodReportCreate, request: Request, background: BackgroundTasks, caller: ReadCaller) -> Response:
    """Store what one install on a pod came to (:class:`~tunecache.contract.PodReportCreate`):
    204, no body.

    The ``read`` policy (see the module: a report decides nothing). Errors: 422 naming the
    invalid field or the rule broken (an ``installed`` report without ``run_id``, an
    ``error`` one without ``error_kind``, an environment that does not hash to
    ``environment_hash``); 413 over :data:`~tunecache.contract.MAX_REPORT_BYTES`; 429 with
    ``Retry-After`` past ``TUNECACHE_REPORT_RATE`` reports from one client address with one
    token; 503 when the database is down or busy. Counted in
    ``tunecache_pod_reports_total`` and ``tunecache_pod_install_seconds`` once stored.
    Reports older than ``TUNECACHE_REPORT_RETENTION_DAYS`` are deleted after the answer, at
    most once a minute per process.
    """
    state = request.app.state
    who = f"{request.client.host if request.client else '-'} {caller.name}"
    if not state.report_rate_limiter.hit(state.report_rate, who):
        reset = state.report_rate_limiter.get_window_stats(state.report_rate, who).reset_time
        raise HTTPException(429, detail=f"too many pod reports from this address with token {caller.name!r}: at most "
                                        f"{state.settings.report_rate}",
                            headers={"Retry-After": str(max(1, math.ceil(reset - time.time())))})
    async with state.report_slots:
        await anyio.to_thread.run_sync(_store, state.sessions, body)
    metrics.observe_pod_report(body.outcome.value, body.install_seconds)
    if state.report_pruner.due():
        background.add_task(_prune, state.sessions, state.settings.report_retention_days)
    return Response(status_code=204)


def _store(sessions: sessionmaker[Session], body: PodReportCreate) -> None:
    with sessions.begin() as session:
        reports.record_report(session, body)


def _prune(sessions: sessionmaker[Session], retention_days: float) -> None:
    """Delete reports older than the retention, in a transaction of its own (after the answer)."""
    try:
        with sessions.begin() as session:
            deleted = reports.prune_reports(session, utcnow() - dt.timedelta(days=retention_days))
    except Exception as exc:  # the next report's process tries again within a minute
        log.warning("old pod reports not deleted: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return
    if deleted:
        log.info("deleted %d pod reports older than %g days", deleted, retention_days)


fleet_router = APIRouter(prefix="/fleet", tags=["fleet"])


@fleet_router.get("", response_model=FleetView)
def fleet(
    session: SessionDep,
    _caller: ReadCaller,
    hours: Annotated[float, Query(gt=0, le=24 * 3650, description="the window of the hit rates and the wanted list")] = 24,
) -> FleetView:
    """The fleet view (:class:`~tunecache.contract.FleetView`), from pods' reports of the
    last ``hours`` (default 24; reports older than ``TUNECACHE_REPORT_RETENTION_DAYS`` are
    gone):

    * ``keys``: every key with a current tuning or with reports in the window: its current
      run in each environment (id, ``created_at``, ``age_s`` seconds, entries, trigger) and
      its reports: ``installed``, ``missed``, ``errors``, ``hit_rate`` = installed / all;
    * ``wanted``: keys and environments pods asked for in the window that still have no
      current tuning: distinct ``pods``, ``reports``, ``last_asked_at``, and the closest run
      and its differing fields as the latest report carried them.

    Three indexed reads in one transaction. 422 names an invalid ``hours``.
    """
    return reports.fleet_view(session, hours)
