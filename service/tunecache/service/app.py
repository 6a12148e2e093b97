"""The FastAPI application: ``create_app(settings)``; engine, sessions and the job worker
live on ``app.state``."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine

from tunecache.service import db
from tunecache.service.errors import install_error_handlers
from tunecache.service.limits import BodySizeLimit
from tunecache.service.routes import artifacts, health, jobs, tunings
from tunecache.contract import WorkerStatus
from tunecache.service.settings import Settings
from tunecache.service.worker import JobWorker, detect_gpu

log = logging.getLogger("tunecache")


def _start_worker(app: FastAPI, settings: Settings) -> JobWorker | None:
    """Start the GPU job worker as ``settings.worker`` says; record why not on ``app.state``.

    Raises:
        RuntimeError: ``worker == "on"`` and this node has no usable GPU.
    """
    if settings.worker == "off":
        app.state.worker_status = WorkerStatus(enabled=False, reason="disabled (TUNECACHE_WORKER=off)")
        return None
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
    )
    (settings.data_dir / "work").mkdir(parents=True, exist_ok=True)
    worker.start()
    app.state.worker_status = WorkerStatus(enabled=True, gpu_name=gpu.gpu_name, arch=gpu.arch, name=worker.name)
    return worker


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """Build the app. On startup it refuses to run on a database whose schema is not at
    the head revision (:class:`tunecache.service.db.SchemaOutOfDate`), then starts the
    GPU job worker per ``settings.worker``."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_engine = engine is None
        app.state.engine = engine or db.create_db_engine(settings.resolved_database_url())
        worker = None
        try:
            db.check_schema(app.state.engine)
            app.state.sessions = db.session_factory(app.state.engine)
            worker = _start_worker(app, settings)
            yield
        finally:
            if worker is not None:
                worker.stop()
            if own_engine:
                app.state.engine.dispose()

    app = FastAPI(
        title="tunecache",
        version="0.1.0",
        summary="Persistent autotune cache for LLM inference fleets",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_upload_bytes)
    for router in (health.router, tunings.router, artifacts.router, jobs.router):
        app.include_router(router, prefix="/v1")
    return app
