"""``/v1/reports``: pods say what each install came to; ``/v1/fleet``: the fleet view from it.

Who may report: the ``read`` policy (anyone, unless ``TUNECACHE_READ_TOKEN_REQUIRED``, then
a token of any scope). Pods hold a read token or none, and a report is a small write that
decides nothing: it never chooses a path, a key row, a tuning or a token, is never read
back by a pod, and only feeds counts (the fleet view, ``tunecache_pod_*`` metrics; with
``TUNECACHE_AUTO_TUNE_VARIANTS``, the distinct tokens :mod:`tunecache.service.variant_autotune`
counts: a report is stored with its token's name, and one without a token never counts). What
keeps it cheap and bounded instead of a token scope: a body of at most
:data:`~tunecache.contract.MAX_REPORT_BYTES`, the bounds of
:mod:`tunecache.service.report_bounds` (per source, per key and source, once per pod boot,
an ``installed`` report only of a real run of its key: past them a report is answered 202
and not stored), no database work on the request (reports are stored in batches by
:class:`~tunecache.service.report_intake.ReportIntake`, which holds at most
``TUNECACHE_REPORT_INTAKE_MAX`` of them: 503 past it), and retention
(``TUNECACHE_REPORT_RETENTION_DAYS``). Reports are not audited (they are not writes to
tunings; a boot storm would flood the audit log).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, HTTPException, Query, Request, Response
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import (FLEET_MAX_HOURS, FLEET_PAGE_DEFAULT, FLEET_PAGE_MAX, MAX_ID, MAX_REPORT_BYTES, ErrorBody, FleetView,
                                PodReportCreate)
from tunecache.service import auto_tune_refusals, metrics, redaction, report_retention, reports
from tunecache.service.client_address import client_address
from tunecache.service.deps import SessionDep
from tunecache.service.report_bounds import source_of
from tunecache.service.models import utcnow
from tunecache.service.policy import ReadCaller
from tunecache.service.state import state_of

log = logging.getLogger("tunecache")

router = APIRouter(prefix="/reports", tags=["fleet"])


@router.post(
    "",
    status_code=202,
    response_class=Response,
    responses={
        413: {"model": ErrorBody, "description": f"The report is over {MAX_REPORT_BYTES} bytes"},
        503: {"model": ErrorBody, "description": "The process holds as many reports not yet stored as it may "
                                                 "(TUNECACHE_REPORT_INTAKE_MAX): the database is behind (Retry-After)"},
    },
)
async def report_install(body: PodReportCreate, request: Request, background: BackgroundTasks, caller: ReadCaller) -> Response:
    """Take what one install on a pod came to (:class:`~tunecache.contract.PodReportCreate`):
    202, no body. The report is stored with others in one insert within
    ``TUNECACHE_REPORT_FLUSH_SECONDS`` (:mod:`tunecache.service.report_intake`); the request
    does no database work.

    The ``read`` policy (see the module: a report decides nothing). Errors: 422 naming the
    invalid field or the rule broken (an ``installed`` report without ``run_id``, an
    ``error`` one without ``error_kind``, an environment that does not hash to
    ``environment_hash``, a ``boot_id`` out of its pattern); 413 over
    :data:`~tunecache.contract.MAX_REPORT_BYTES`; 503 with ``Retry-After`` when the process
    already holds ``TUNECACHE_REPORT_INTAKE_MAX`` reports not yet stored (the database is
    down or behind). A report past its source's ``TUNECACHE_REPORT_SOURCE_MAX`` in the hour
    is answered 202 and not taken (not 429: see :mod:`tunecache.service.report_bounds`);
    one taken may still not be stored (past a key's or a source's bounds, a repeat of its
    boot, an ``installed`` one naming no run of its key). Counted in
    ``tunecache_pod_reports_total`` and ``tunecache_pod_install_seconds`` once taken; those
    not stored in ``tunecache_pod_reports_dropped_total{reason}``. Reports older than ``TUNECACHE_REPORT_RETENTION_DAYS`` are deleted after the
    answer, at most once a minute per process.
    """
    state = state_of(request.app)
    source = source_of(client_address(request), caller)
    if not state.report_gate.admit(source):
        metrics.pod_report_dropped("source")
        return Response(status_code=202)
    if not state.report_intake.offer(body, utcnow(), source, None if caller.anonymous else caller.name):
        raise HTTPException(503, detail=f"{state.report_intake.max_rows} pod reports are waiting to be stored; "
                                        "try again later",
                            headers={"Retry-After": str(state.settings.retry_after_seconds)})
    metrics.observe_pod_report(body.outcome.value, body.install_seconds)
    if state.report_pruner.due():
        background.add_task(_prune, state.sessions, state.settings.report_retention_days)
    return Response(status_code=202)


def _prune(sessions: sessionmaker[Session], retention_days: float) -> None:
    """Delete reports older than the retention, in a transaction of its own (after the answer)."""
    try:
        with sessions.begin() as session:
            older_than = utcnow() - dt.timedelta(days=retention_days)
            deleted = report_retention.prune_reports(session, older_than)
            auto_tune_refusals.prune(session, older_than)
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
    hours: Annotated[float, Query(gt=0, le=FLEET_MAX_HOURS, description="the window of the hit rates and the wanted list, "
                                                                   "hours back from now")] = 24,
    limit: Annotated[int, Query(ge=1, le=FLEET_PAGE_MAX, description="keys on the page")] = FLEET_PAGE_DEFAULT,
    offset: Annotated[int, Query(ge=0, le=MAX_ID, description="keys before the page, in the matrix's order")] = 0,
    wanted_limit: Annotated[int, Query(ge=1, le=FLEET_PAGE_MAX,
                                       description="wanted tunings on the page")] = FLEET_PAGE_DEFAULT,
    wanted_offset: Annotated[int, Query(ge=0, le=MAX_ID,
                                        description="wanted tunings before the page, in the list's order")] = 0,
) -> FleetView:
    """One page of the fleet view (:class:`~tunecache.contract.FleetView`), from pods'
    reports of the last ``hours`` (default 24; reports older than
    ``TUNECACHE_REPORT_RETENTION_DAYS`` are gone):

    * ``keys``: ``limit`` (1-1000, default 100) rows from ``offset`` (0-based) of the
      ``total_keys`` keys with a current tuning or with reports in the window, most reports
      first, then model, GPU name, ``max_num_batched_tokens``, key hash: each key's current
      run in each environment (id, ``created_at``, ``age_s`` seconds, entries, trigger) and
      its reports in pod boots (a boot counts once): ``installed``, ``missed``, ``errors``,
      ``hit_rate`` = installed / all;
    * ``wanted``: ``wanted_limit`` (1-1000, default 100) from ``wanted_offset`` of the
      ``total_wanted`` keys and environments pods asked for in the window that still have
      no current tuning, most distinct sources first (then most distinct pods, most boots,
      latest asked, key hash, environment hash): ``sources`` (client addresses, or token
      names, that asked), ``pods``, ``reports``, ``last_asked_at``, and the closest
      run and its differing fields as the latest report carried them.

    Pages by offset, not by cursor: the order is by report counts, which move as reports
    arrive, so no position in it lasts; a client walks ``offset`` = 0, ``limit``, ... while
    below ``total_keys`` (an offset past the end: an empty page, 200). Within one window the
    pages neither overlap nor leave a key out; a key whose count changes between two
    requests may move to another page.

    Three indexed reads in one transaction; every key is counted and ordered, only the
    page's rows are built. Engine variants' ``engine_args`` as
    :func:`~tunecache.service.redaction.engine_args_for_readers` shows them; no token or pod
    names (counts only). 422 names the parameter out of range (``hours``, ``limit``,
    ``offset``, ``wanted_limit``, ``wanted_offset``).
    """
    return redaction.fleet_for_readers(reports.fleet_view(session, hours, limit=limit, offset=offset,
                                                          wanted_limit=wanted_limit, wanted_offset=wanted_offset))
