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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO

import anyio.to_thread
import limits
from cachetools import TTLCache
from fastapi import FastAPI
from starlette.routing import compile_path
from sqlalchemy import Engine

from tunecache.service import db, policy
from tunecache.service.errors import COMMON_ERRORS, install_error_handlers
from tunecache.service.hot_path import ArtifactFiles, GenerationConnection, GenerationReader, LookupCache, SingleFlight
from tunecache.service.limits import BodySizeLimit, LoadShedding
from tunecache.service.routes import artifacts, audit, health, jobs, tokens, tunings

from tunecache.contract import WorkerStatus
from tunecache.service.settings import Settings
from tunecache.service.worker import JobWorker, detect_gpu
from tunecache.signing import load_signing_key

log = logging.getLogger("tunecache")

#: Every router of the API, mounted under ``/v1``; each of their routes declares a caller
#: policy (:mod:`tunecache.service.policy`).
API_ROUTERS = (health.router, tunings.router, artifacts.router, jobs.router, tokens.router, audit.router)


def _start_worker(app: FastAPI, settings: Settings) -> JobWorker | None:
    """Start the GPU job worker as ``settings.worker`` says; record why not on ``app.state``.

    Raises:
        RuntimeError: ``worker == "on"`` and this node has no usable GPU.
        SigningError (:mod:`tunecache.signing`): ``TUNECACHE_SIGNING_KEY`` is not a usable key.
    """
    if settings.worker == "off":
        app.state.worker_status = WorkerStatus(enabled=False, reason="disabled (TUNECACHE_WORKER=off)")
        return None
    lock = _worker_lock(settings)
    if lock is None:
        app.state.worker_status = WorkerStatus(enabled=False, reason="another process of this node runs the job worker")
        return None
    app.state.worker_lock = lock
    gpu, reason = detect_gpu()
    if gpu is None:
        if settings.worker == "on":
            raise RuntimeError(f"TUNECACHE_WORKER=on but this node cannot tune: {reason}")
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
    )
    (settings.data_dir / "work").mkdir(parents=True, exist_ok=True)
    worker.start()
    app.state.worker_status = WorkerStatus(enabled=True, gpu_name=gpu.gpu_name, arch=gpu.arch, name=worker.name)
    return worker


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
    GPU job worker per ``settings.worker``."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_engine = engine is None
        app.state.engine = engine or db.engine_for(settings)
        # Sync routes run on this many threads, each with a database connection of its own.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        app.state.lookup_cache = LookupCache(settings.lookup_cache_entries)
        app.state.job_rate = limits.parse(settings.job_request_rate)
        app.state.job_rate_limiter = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
        app.state.artifact_files = ArtifactFiles(settings.artifact_cache_dir)
        app.state.artifact_mirrors = SingleFlight()
        app.state.token_cache = TTLCache(maxsize=4096, ttl=settings.token_cache_seconds)
        worker = generation_connection = None
        try:
            db.check_schema(app.state.engine)
            app.state.sessions = db.session_factory(app.state.engine)

            generation_connection = GenerationConnection(app.state.engine)
            app.state.generation_reader = GenerationReader(generation_connection.read)
            gc.freeze()  # what startup allocated is never collected: shorter GC pauses under load
            worker = _start_worker(app, settings)
            yield
        finally:
            if worker is not None:
                worker.stop()
            if generation_connection is not None:
                generation_connection.close()
            if getattr(app.state, "worker_lock", None) is not None:
                app.state.worker_lock.close()
            if own_engine:
                app.state.engine.dispose()

    app = FastAPI(
        title="tunecache",
        version=_server_version(),
        summary="Persistent autotune cache for LLM inference fleets",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app, retry_after_s=settings.retry_after_seconds)
    app.add_middleware(BodySizeLimit, max_upload_bytes=settings.max_upload_bytes, max_json_bytes=settings.max_json_bytes)
    # Added last, so it runs first: a saturated process answers 503 before doing any work.
    app.add_middleware(LoadShedding, max_in_flight=settings.max_in_flight, retry_after_s=settings.retry_after_seconds)
    app.state.path_methods = []  # (path regex, methods) of every route, for the Allow of a 405
    for router in API_ROUTERS:
        app.include_router(router, prefix="/v1", responses=COMMON_ERRORS)
        app.state.path_methods += [(compile_path("/v1" + route.path)[0], frozenset(route.methods)) for route in router.routes]
    _document_optional_tokens(app, settings)
    return app


def _document_optional_tokens(app: FastAPI, settings: Settings) -> None:
    """In the OpenAPI document, the routes anyone may call (``PUBLIC``, and ``READ`` unless
    ``TUNECACHE_READ_TOKEN_REQUIRED``) take the bearer token as optional (``security: [{},
    {"HTTPBearer": []}]``); the others require it, as FastAPI writes it."""
    optional = {policy.PUBLIC} | (set() if settings.read_token_required else {policy.READ})
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for router in API_ROUTERS:
                for route in router.routes:
                    if policy.policy_of(route) in optional:
                        for method in route.methods:
                            schema["paths"]["/v1" + route.path_format][method.lower()]["security"] = [{}, {"HTTPBearer": []}]
        return app.openapi_schema

    app.openapi = openapi
