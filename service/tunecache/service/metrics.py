"""Prometheus metrics of the service, exposed by ``GET /metrics`` (:mod:`tunecache.service.routes.metrics`).

Counted in each process, on the request path (one counter increment, no lock held across
an ``await``, no database work, labels only from fixed sets: route templates, never raw
paths, model names or tokens):

* ``tunecache_http_requests_total{method, route, status}``: every HTTP answer, by route
  template (``/v1/artifacts/{sha256}``; ``unrouted`` for answers given before or without
  routing: unknown paths, load-shedding 503s, 413s on a declared length), counted by
  :class:`RequestCounter`, the outermost middleware.
* ``tunecache_lookups_total{outcome, source}``: ``POST /v1/tunings/lookup`` answers:
  ``outcome`` ``hit`` (a tuning), ``miss`` (404) or ``error`` (database too slow or
  unavailable); ``source`` ``cache`` (the process's lookup cache) or ``database``.
* ``tunecache_artifact_bytes_served_total``: body bytes of ``GET /v1/artifacts/{sha256}``
  answers (200 and 206; a 304 sends none), whether from memory or from the file mirror.

Recorded by the GPU job worker (:mod:`tunecache.service.worker`):

* ``tunecache_job_duration_seconds{outcome}`` (histogram): from the start of a claimed
  job's tuning to its end, by ``succeeded``, ``failed``, ``cancelled`` or ``lost`` (its
  lease expired; the result was dropped).
* ``tunecache_job_stage_duration_seconds{stage}`` (histogram): each tuner stage that
  finished (``StageChanged`` with ``status="done"``), as the tuner measured it.

Counted from pod reports (``POST /v1/reports``), in the process that accepted each:

* ``tunecache_pod_install_seconds{outcome}`` (histogram): seconds the pod's install took,
  as the pod measured them, by ``installed``, ``miss`` or ``error``;
* ``tunecache_pod_reports_total{outcome}``: reports accepted, by outcome.
* ``tunecache_pod_reports_dropped_total{reason}``: reports answered 202 and not stored
  (:mod:`tunecache.service.report_bounds`): ``source`` (past ``TUNECACHE_REPORT_SOURCE_MAX``
  of its source in the hour), ``key`` (past ``TUNECACHE_REPORT_BOOTS_PER_KEY``), ``new_key``
  (past ``TUNECACHE_REPORT_NEW_KEYS``), ``unknown_run`` (an ``installed`` report whose run
  does not exist or is another key's), ``repeat`` (a report its boot already sent).

Per process: ``tunecache_job_worker_enabled`` (gauge): 1 in the process that runs this
node's job worker, else 0.

Read from the database at scrape time (:class:`JobsCollector`), so the same on every
process and replica (aggregate them with ``max``, not ``sum``):
``tunecache_jobs{state}``, ``tunecache_job_queue_depth``,
``tunecache_job_oldest_queued_seconds``, ``tunecache_database_up``.

Several processes (``tunecache serve --processes N``): prometheus-client's multiprocess
mode. ``PROMETHEUS_MULTIPROC_DIR`` must be set before ``prometheus_client`` is imported
(``serve`` makes a private directory and removes it at exit when ``N > 1`` and the
variable is unset); each process then keeps its values in files of its own there, and
:func:`exposition` adds up every process's files, whichever process answers the scrape.
The one gauge kept per process uses ``multiprocess_mode="livemax"``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any, BinaryIO

import anyio
import anyio.to_thread

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tunecache.contract import AUTO_TUNE_REFUSALS, JobStatus, ReportOutcome, Stage
from tunecache.service.models import TuningJob, utcnow

log = logging.getLogger("tunecache.metrics")

#: The exposition format ``GET /metrics`` answers in (Prometheus' text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The variable that turns on prometheus-client's multiprocess mode (read at its import).
MULTIPROC_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

#: ``route`` label of answers given before or without routing.
UNROUTED = "unrouted"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})

disable_created_metrics()  # no *_created series: half the size of every scrape, and no use to a dashboard
HTTP_REQUESTS = Counter("tunecache_http_requests", "HTTP answers by method, route template and status",
                        ["method", "route", "status"])
LOOKUPS = Counter("tunecache_lookups", "Lookups answered, by outcome (hit, miss, error) and source (cache, database)",
                  ["outcome", "source"])
ARTIFACT_BYTES = Counter("tunecache_artifact_bytes_served", "Body bytes sent by GET /v1/artifacts/{sha256} (200 and 206)")
JOB_DURATION = Histogram("tunecache_job_duration_seconds", "Tuning jobs run by this server's worker, by outcome",
                         ["outcome"], buckets=(10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200))
STAGE_DURATION = Histogram("tunecache_job_stage_duration_seconds", "Tuner stages finished, as the tuner measured them",
                           ["stage"], buckets=(0.5, 1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600))
JOB_WORKER = Gauge("tunecache_job_worker_enabled", "1 when this server runs its node's GPU job worker",
                   multiprocess_mode="livemax")
POD_INSTALL = Histogram("tunecache_pod_install_seconds", "Installs on pods as their reports say, by outcome (installed, "
                        "miss, error): seconds from the start of the install to its end", ["outcome"],
                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120))
POD_REPORTS = Counter("tunecache_pod_reports", "Pod install reports accepted, by outcome (installed, miss, error)",
                      ["outcome"])
POD_REPORTS_DROPPED = Counter("tunecache_pod_reports_dropped", "Pod reports answered 202 and not stored, by reason "
                              "(source, key, new_key, unknown_run, repeat: tunecache.service.report_bounds)", ["reason"])

#: Why a report taken may not be stored (:mod:`tunecache.service.report_bounds`).
DROP_REASONS = ("source", "key", "new_key", "unknown_run", "repeat")
_DROPPED_CHILDREN = {reason: POD_REPORTS_DROPPED.labels(reason) for reason in DROP_REASONS}
AUTO_TUNE_REFUSED = Counter("tunecache_auto_tune_refused", "Automatic tunings of an engine variant not queued, by "
                            "reason (tunecache.service.variant_autotune)", ["reason"])
_REFUSED_CHILDREN = {reason: AUTO_TUNE_REFUSED.labels(reason) for reason in AUTO_TUNE_REFUSALS}

#: Outcomes of :data:`JOB_DURATION`.
JOB_OUTCOMES = ("succeeded", "failed", "cancelled", "lost")

# Every known series exists from the start (at 0), so that rate() sees the first event;
# the children are bound once, so the request path does no label lookup.
_LOOKUP_CHILDREN = {
    (200, True): LOOKUPS.labels("hit", "cache"),
    (200, False): LOOKUPS.labels("hit", "database"),
    (404, True): LOOKUPS.labels("miss", "cache"),
    (404, False): LOOKUPS.labels("miss", "database"),
}
_LOOKUP_ERROR = LOOKUPS.labels("error", "database")
for _outcome in JOB_OUTCOMES:
    JOB_DURATION.labels(_outcome)
#: Outcomes of :data:`POD_INSTALL` and :data:`POD_REPORTS` (:class:`~tunecache.contract.ReportOutcome`).
_POD_CHILDREN = {outcome.value: (POD_INSTALL.labels(outcome.value), POD_REPORTS.labels(outcome.value))
                 for outcome in ReportOutcome}
for _stage in Stage:
    STAGE_DURATION.labels(_stage.value)
_http_children: dict[tuple[str, str, int], Any] = {}


def multiprocess_mode() -> bool:
    """Whether this process counts in prometheus-client's multiprocess mode."""
    return MULTIPROC_DIR_VARIABLE in os.environ


def count_lookup(status: int, from_cache: bool) -> None:
    """Count one lookup answer: ``status`` 200 is a hit, 404 a miss (anything else an error);
    ``from_cache``: answered from the process's lookup cache."""
    _LOOKUP_CHILDREN.get((status, from_cache), _LOOKUP_ERROR).inc()


def count_lookup_error() -> None:
    """Count one lookup that got no answer from the database (503, or an error)."""
    _LOOKUP_ERROR.inc()


def observe_job(outcome: str, seconds: float) -> None:
    """Record a job this process's worker finished (``outcome`` one of :data:`JOB_OUTCOMES`)."""
    JOB_DURATION.labels(outcome).observe(seconds)


def observe_stage(stage: str, seconds: float) -> None:
    """Record a finished tuner stage (``stage``: a :class:`~tunecache.contract.Stage` value)."""
    STAGE_DURATION.labels(stage).observe(seconds)


def observe_pod_report(outcome: str, install_seconds: float) -> None:
    """Count an accepted pod report (``outcome``: a :class:`~tunecache.contract.ReportOutcome`
    value) and its install's seconds, as the pod measured them."""
    install, reports = _POD_CHILDREN[outcome]
    install.observe(install_seconds)
    reports.inc()


def pod_report_dropped(reason: str) -> None:
    """Count a pod report answered 202 and not stored (``reason``: one of :data:`DROP_REASONS`)."""
    _DROPPED_CHILDREN[reason].inc()


def auto_tune_refused(reason: str) -> None:
    """Count an automatic tuning not queued (``reason``: one of
    :data:`~tunecache.contract.AUTO_TUNE_REFUSALS`)."""
    _REFUSED_CHILDREN[reason].inc()


def set_job_worker(enabled: bool) -> None:
    """Say whether this process runs the node's job worker."""
    JOB_WORKER.set(1 if enabled else 0)


def process_exiting() -> None:
    """At a process's orderly exit in multiprocess mode: drop its per-process gauges
    (``livemax``), so the scrape no longer counts them; its counters stay counted."""
    if multiprocess_mode():
        multiprocess.mark_process_dead(os.getpid())


class RequestCounter:
    """ASGI middleware: counts every HTTP answer in ``tunecache_http_requests_total``.

    Labels come from fixed sets: the method (others: ``OTHER``), the matched route's
    template or ``unrouted``, and the status (500 when the app raised before answering).
    ``templates`` maps the ``id`` of each route's endpoint (module-level functions, alive as
    long as the app; routing puts the endpoint in the scope) to the route's full template,
    with the prefix it is mounted under. Two dictionary lookups and one
    increment per request, after the answer.
    """

    def __init__(self, app: ASGIApp, templates: dict[int, str]):
        self.app = app
        self._templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except Exception:
            status = status or 500
            raise
        finally:
            if status:
                method = scope["method"] if scope["method"] in _METHODS else "OTHER"
                key = (method, self._templates.get(id(scope.get("endpoint")), UNROUTED), status)
                child = _http_children.get(key)
                if child is None:
                    child = _http_children[key] = HTTP_REQUESTS.labels(method, key[1], str(status))
                child.inc()


class _CountsArtifactBytes:
    """Counts the body bytes of a 200 or 206 answer in ``tunecache_artifact_bytes_served_total``
    (once, when the answer is done, also when the client went away half way)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        counted = False
        sent = 0

        async def counting(message: Message) -> None:
            nonlocal counted, sent
            kind = message["type"]
            if kind == "http.response.start":
                counted = message["status"] in (200, 206)
            elif counted and kind == "http.response.body":
                sent += len(message.get("body", b""))
            elif counted and kind == "http.response.pathsend":  # the server sends the whole file itself
                sent += os.path.getsize(message["path"])
            await send(message)

        try:
            await super().__call__(scope, receive, counting)  # type: ignore[misc]
        finally:
            if sent:
                ARTIFACT_BYTES.inc(sent)


class ArtifactResponse(_CountsArtifactBytes, Response):
    """An artifact's bytes from memory, counted in ``tunecache_artifact_bytes_served_total``."""


class ArtifactStreamingResponse(_CountsArtifactBytes, StreamingResponse):
    """An artifact's bytes streamed from the database (its mirror could not be written),
    counted in ``tunecache_artifact_bytes_served_total``."""


class ArtifactFileResponse(_CountsArtifactBytes, FileResponse):
    """An artifact's file (whole, or the ranges asked for), counted in
    ``tunecache_artifact_bytes_served_total``; read in threads of ``limiter``
    (``TUNECACHE_FILE_THREADS``), not in those that run database work, so that routes
    waiting for the database never hold up file serving."""

    def __init__(self, path: str | os.PathLike, *, limiter: anyio.CapacityLimiter | None = None, **kwargs: Any):
        super().__init__(path, **kwargs)
        self._limiter = limiter

    @asynccontextmanager
    async def _open_file(self) -> AsyncIterator[Any]:
        if self._limiter is None:
            async with super()._open_file() as file:
                yield file
            return
        file = _LimitedFile(await anyio.to_thread.run_sync(open, self.path, "rb", limiter=self._limiter), self._limiter)
        try:
            yield file
        finally:
            with anyio.CancelScope(shield=True):  # closing must finish even when the transfer is cancelled
                await anyio.to_thread.run_sync(file.raw.close, limiter=self._limiter)


class _LimitedFile:
    """The part of ``anyio.AsyncFile`` that ``FileResponse`` uses, in threads of one limiter."""

    def __init__(self, raw: BinaryIO, limiter: anyio.CapacityLimiter):
        self.raw = raw
        self._limiter = limiter

    async def read(self, size: int = -1) -> bytes:
        return await anyio.to_thread.run_sync(self.raw.read, size, limiter=self._limiter)

    async def seek(self, offset: int, whence: int = 0) -> int:
        return await anyio.to_thread.run_sync(self.raw.seek, offset, whence, limiter=self._limiter)


#: Jobs per state: a scan of the ``(status, created_at)`` index, not of the table.
JOBS_BY_STATE = select(TuningJob.status, func.count()).group_by(TuningJob.status)
#: The oldest queued job: the first entry of the ``(status, created_at)`` index under ``queued``.
OLDEST_QUEUED = select(func.min(TuningJob.created_at)).where(TuningJob.status == JobStatus.QUEUED.value)


class JobsCollector:
    """Job gauges read from the database when scraped: right across processes and
    replicas (every one reports the same numbers). Two index-only queries in one short
    transaction; a database that does not answer gives ``tunecache_database_up 0`` and no
    job gauges, and the rest of the scrape is still served."""

    def __init__(self, sessions: sessionmaker[Session]):
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        """The gauges, from one read of the ``tuning_jobs`` table."""
        up = GaugeMetricFamily("tunecache_database_up", "1 when the database answered this scrape's job queries")
        try:
            with self._sessions.begin() as session:
                counts = {status: count for status, count in session.execute(JOBS_BY_STATE)}
                oldest = session.scalar(OLDEST_QUEUED)
        except SQLAlchemyError as exc:
            log.warning("metrics: job gauges not read, the database did not answer: %s", str(exc).splitlines()[0])
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        by_state = GaugeMetricFamily("tunecache_jobs", "Tuning jobs by state (from the database)", labels=["state"])
        for state in sorted({*(s.value for s in JobStatus), *counts}):
            by_state.add_metric([state], counts.get(state, 0))
        yield by_state
        yield GaugeMetricFamily("tunecache_job_queue_depth", "Queued tuning jobs waiting for a worker (from the database)",
                                value=counts.get(JobStatus.QUEUED.value, 0))
        age = max((utcnow() - oldest).total_seconds(), 0.0) if oldest is not None else 0.0
        yield GaugeMetricFamily("tunecache_job_oldest_queued_seconds",
                                "Age of the oldest queued tuning job, 0 when none is queued (from the database)", value=age)


class _Collectors:
    """Several collectors as one, for :func:`prometheus_client.generate_latest`."""

    def __init__(self, collectors: Iterable[Any]):
        self._collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


def exposition(sessions: sessionmaker[Session]) -> bytes:
    """The scrape: this process's metrics (in multiprocess mode every process's, added up
    from their files) and the job gauges read from the database, in the text format."""
    if multiprocess_mode():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    return generate_latest(_Collectors((registry, JobsCollector(sessions))))  # type: ignore[arg-type]
