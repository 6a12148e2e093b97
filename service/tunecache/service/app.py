"""The FastAPI application: ``create_app(settings)``; engine, sessions, the hot-path caches
and the job worker live on ``app.state``. ``tunecache serve --workers N`` runs ``N``
processes of it (uvicorn's factory mode); one of a node's processes runs the job worker."""

from __future__ import annotations

import fcntl
import gc
import importlib.metadata
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO

import anyio
import anyio.to_thread
from cachetools import TTLCache
from fastapi import FastAPI
from starlette.routing import Route, compile_path
from sqlalchemy import Engine

from tunecache.service import artifact_store, db, metrics, policy, run_diff
from tunecache.service import api_docs, dashboard
from tunecache.service.errors import COMMON_ERRORS, install_error_handlers
from tunecache.service.hot_path import ArtifactFiles, GenerationConnection, GenerationReader, LookupCache, SingleFlight
from tunecache.service.limits import AllowedHosts, LoadShedding, RateLimit, RequestBodyGuard
from tunecache.service.report_bounds import ReportFilter, SourceGate
from tunecache.service.report_intake import ReportIntake
from tunecache.service.reports import Pruner
from tunecache.service.retention import Maintenance
from tunecache.service.routes import artifacts, audit, health, jobs, reports, tokens, tunings
from tunecache.service.routes import metrics as metrics_route

from tunecache.contract import MAX_REPORT_BYTES, WorkerStatus
from tunecache.service.settings import Settings, server_trusted_keys, variable_name
from tunecache.service.worker import JobWorker, detect_gpu
from tunecache.signing import load_signing_key

log = logging.getLogger("tunecache")

#: Every router of the API, mounted under ``/v1``; each of their routes declares a caller
#: policy (:mod:`tunecache.service.policy`).
API_ROUTERS = (health.router, tunings.router, artifacts.router, jobs.router, jobs.workers_router, tokens.router, audit.router,
               reports.router, reports.fleet_router)
#: Routers mounted at the root, outside ``/v1``: ``GET /metrics``, where Prometheus looks by default.
ROOT_ROUTERS = (metrics_route.router,)
#: ``(prefix, router)`` of every router the app serves.
MOUNTED_ROUTERS = tuple(("/v1", router) for router in API_ROUTERS) + tuple(("", router) for router in ROOT_ROUTERS)


def _start_worker(app: FastAPI, settings: Settings) -> JobWorker | None:
    """Start the GPU job worker as ``settings.job_worker`` says; record why not on ``app.state``.

    Raises:
        RuntimeError: ``job_worker == "on"`` and this node has no usable GPU.
        SigningError (:mod:`tunecache.signing`): ``TUNECACHE_SIGNING_KEY`` is not a usable key.
    """
    if settings.job_worker == "off":
        app.state.worker_status = WorkerStatus(enabled=False, reason=f"disabled ({variable_name('job_worker')}=off)")
        return None
    lock = _worker_lock(settings)
    if lock is None:
        # the process holding the lock runs the worker, or found no GPU: only it knows which
        app.state.worker_status = WorkerStatus(
            enabled=False, reason="another process of this node holds the job worker's lock (it runs the worker, "
                                  "or found no GPU; its /v1/health says which)")
        return None
    app.state.worker_lock = lock
    gpu, reason = detect_gpu()
    if gpu is None:
        if settings.job_worker == "on":
            raise RuntimeError(f"{variable_name('job_worker')}=on but this node cannot tune: {reason}")
        log.warning("no GPU job worker on this node (%s); serving lookups only", reason)
        app.state.worker_status = WorkerStatus(enabled=False, reason=f"no GPU: {reason}")
        return None
    worker = JobWorker(
        app.state.sessions,
        gpu,
        f"{socket.gethostname()}:{os.getpid()}",
        lease_s=settings.lease_seconds,
        job_timeout_s=settings.job_timeout_seconds,
        max_attempts=settings.job_max_attempts,
        poll_s=settings.worker_poll_seconds,
        work_root=settings.data_dir / "work",
        model_config_dir=settings.model_config_dir,
        signing_key=load_signing_key(settings.signing_key) if settings.signing_key else None,
        trusted_keys=app.state.trusted_keys,
        verify=_verifier(settings),
    )
    (settings.data_dir / "work").mkdir(parents=True, exist_ok=True)
    worker.start()
    app.state.worker_status = WorkerStatus(enabled=True, gpu_name=gpu.gpu_name, arch=gpu.arch, name=worker.name)
    return worker


def _verifier(settings: Settings):
    """The job worker's verification boot of a recorded vLLM warmup: against the service's own
    URL (``TUNECACHE_VERIFY_URL``), trusting the node's own signing key; ``None`` when it is
    ``off`` or unknown."""
    url = settings.verify_url
    if not url or url == "off":
        return None
    from tunecache.service.tuner.verification import verify_run
    from tunecache.signing import format_public_key

    trusted = (format_public_key(load_signing_key(settings.signing_key).public_key())
               if settings.signing_key else None)
    return lambda spec, scratch: verify_run(spec, url, scratch, settings.job_timeout_seconds, trusted_keys=trusted)


def _auto_tune_variants(settings: Settings):
    """What the report intake does after each batch when ``TUNECACHE_AUTO_TUNE_VARIANTS`` is on
    (:func:`tunecache.service.variant_autotune.queue_wanted_variants`); ``None`` when it is off."""
    if not settings.auto_tune_variants:
        return None
    from tunecache.service.variant_autotune import queue_wanted_variants

    return lambda session, rows: queue_wanted_variants(session, rows, settings.auto_tune_variants,
                                                       settings.auto_tune_variant_hours)


def _worker_lock(settings: Settings) -> IO | None:
    """An exclusive lock on ``<data dir>/worker.lock`` held for this process's life, or
    ``None`` when another process of the node holds it (one job worker per node: one
    tuning at a time on its GPU, however many server processes run)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(settings.data_dir / "worker.lock", "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _server_version() -> str:
    """The installed ``tunecache-server`` version (shown in the OpenAPI document)."""
    try:
        return importlib.metadata.version("tunecache-server")
    except importlib.metadata.PackageNotFoundError:  # run from the source roots (GPU machines)
        return "unknown"


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """Build the app. On startup it refuses to run on a database whose schema is not at
    the head revision (:class:`tunecache.service.db.SchemaOutOfDate`), then starts the
    GPU job worker per ``settings.job_worker``."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_engine = engine is None
        app.state.engine = engine or db.engine_for(settings)
        # Sync routes run on this many threads, each with a database connection of its own.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        app.state.lookup_cache = LookupCache(settings.lookup_cache_entries)
        app.state.job_requests = RateLimit(settings.job_request_rate, "tuning-job requests")
        app.state.report_gate = SourceGate(settings.report_source_max)
        app.state.report_pruner = Pruner()
        app.state.artifact_files = ArtifactFiles(settings.artifact_cache_dir)
        app.state.artifact_mirrors = SingleFlight()
        app.state.diff_slots = threading.BoundedSemaphore(run_diff.DIFFS_AT_ONCE)
        app.state.health_probes = SingleFlight()
        app.state.health_threads = anyio.CapacityLimiter(1)  # the one probe in flight (routes/health.py)
        # Mirrored artifact files are read in threads of their own, never behind database work.
        app.state.file_threads = anyio.CapacityLimiter(settings.file_threads)
        app.state.token_cache = TTLCache(maxsize=4096, ttl=settings.token_cache_seconds)
        app.state.trusted_keys = server_trusted_keys(settings)
        worker = generation_connection = report_intake = maintenance = None
        try:
            db.check_schema(app.state.engine)
            app.state.sessions = db.session_factory(app.state.engine)
            # every session carries the artifact stores (tunecache.service.artifact_store.stores_of)
            app.state.artifact_stores = artifact_store.stores_for_url(settings.artifact_store)
            app.state.sessions.configure(info={"artifact_stores": app.state.artifact_stores})
            app.state.report_intake = report_intake = ReportIntake(
                app.state.sessions, settings.report_flush_seconds, settings.report_intake_max,
                ReportFilter(settings.report_boots_per_key, settings.report_new_keys),
                after_batch=_auto_tune_variants(settings))
            report_intake.start()

            generation_connection = GenerationConnection(app.state.engine)
            # its one read at a time runs in a thread of its own, on a connection opened now (not
            # taken from the pool later, when the routes' threads may hold every connection)
            app.state.generation_reader = GenerationReader(generation_connection.read, limiter=anyio.CapacityLimiter(1))
            await anyio.to_thread.run_sync(generation_connection.read)
            gc.freeze()  # what startup allocated is never collected: shorter GC pauses under load
            worker = _start_worker(app, settings)
            metrics.set_job_worker(worker is not None)
            # runs past TUNECACHE_RUN_RETENTION, unreferenced blobs, the mirror past its cap: in a thread, never a request
            app.state.maintenance = maintenance = Maintenance(
                app.state.sessions, app.state.artifact_files, settings.retention_policy,
                settings.retention_interval_seconds, lock_path=settings.data_dir / "retention.lock")
            maintenance.start()
            yield
        finally:
            if maintenance is not None:
                await anyio.to_thread.run_sync(maintenance.stop)
            if worker is not None:
                worker.stop()
            if report_intake is not None:
                await anyio.to_thread.run_sync(report_intake.stop)
            if generation_connection is not None:
                generation_connection.close()
            if getattr(app.state, "worker_lock", None) is not None:
                app.state.worker_lock.close()
            if own_engine:
                app.state.engine.dispose()
            metrics.process_exiting()

    app = FastAPI(
        title="tunecache",
        version=_server_version(),
        summary="Persistent autotune cache for LLM inference fleets",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc: from files installed with the server, no CDN (api_docs)
        redoc_url=None,
    )
    app.state.settings = settings
    install_error_handlers(app, retry_after_s=settings.retry_after_seconds)
    app.add_middleware(RequestBodyGuard, max_upload_bytes=settings.max_upload_bytes, max_json_bytes=settings.max_json_bytes,
                       max_report_bytes=MAX_REPORT_BYTES, timeout_s=settings.body_timeout_seconds)
    # Added late, so it runs early: a saturated process answers 503 before doing any work.
    app.add_middleware(LoadShedding, max_in_flight=settings.max_in_flight, retry_after_s=settings.retry_after_seconds)
    app.state.path_methods = []  # (path regex, methods) of every route, for the Allow of a 405
    for prefix, router in MOUNTED_ROUTERS:
        app.include_router(router, prefix=prefix, responses=COMMON_ERRORS)
        app.state.path_methods += [(compile_path(prefix + route.path)[0], frozenset(route.methods)) for route in router.routes]
    dashboard_templates = dashboard.install(app)  # the web dashboard at / (HTML; not in the OpenAPI document)
    docs_templates = api_docs.install(app)  # /docs and /redoc with their files, open to anyone as /openapi.json
    # Before any work: a Host the service does not answer to (DNS rebinding) gets 400.
    if settings.allowed_host_list != ["*"]:
        app.add_middleware(AllowedHosts, allowed_hosts=settings.allowed_host_list)
    # Outermost: counts every answer, the 503s of load shedding too (one increment each).
    app.add_middleware(metrics.RequestCounter, templates=_route_templates(app) | dashboard_templates | docs_templates)
    _document_optional_tokens(app, settings)
    return app


def _route_templates(app: FastAPI) -> dict[int, str]:
    """The full path template of every route, by the ``id`` of its endpoint (what routing
    puts in a request's scope): FastAPI's own routes and those of :data:`MOUNTED_ROUTERS`,
    with the prefix they are mounted under (the label ``route`` of
    ``tunecache_http_requests_total``)."""
    templates = {id(route.endpoint): route.path_format for route in app.routes if isinstance(route, Route)}
    templates.update({id(route.endpoint): prefix + route.path_format
                      for prefix, router in MOUNTED_ROUTERS for route in router.routes})
    return templates


def _document_optional_tokens(app: FastAPI, settings: Settings) -> None:
    """In the OpenAPI document, the routes anyone may call (``PUBLIC``, and ``READ`` unless
    ``TUNECACHE_READ_TOKEN_REQUIRED``) take the bearer token as optional (``security: [{},
    {"HTTPBearer": []}]``); the others require it, as FastAPI writes it."""
    optional = {policy.PUBLIC} | (set() if settings.read_token_required else {policy.READ})
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for prefix, router in MOUNTED_ROUTERS:
                for route in router.routes:
                    if policy.policy_of(route) in optional:
                        for method in route.methods:
                            schema["paths"][prefix + route.path_format][method.lower()]["security"] = [{}, {"HTTPBearer": []}]
        return app.openapi_schema

    app.openapi = openapi
