"""The FastAPI application: ``create_app(settings)``; engine and sessions live on ``app.state``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from fastapi import FastAPI
from sqlalchemy import Engine

from tunecache.service import db
from tunecache.service.limits import BodySizeLimit
from tunecache.service.routes import artifacts, health, tunings
from tunecache.service.settings import Settings


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """Build the app. On startup it refuses to run on a database whose schema is not at
    the head revision (:class:`tunecache.service.db.SchemaOutOfDate`)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_engine = engine is None
        app.state.engine = engine or db.create_db_engine(settings.resolved_database_url())
        try:
            db.check_schema(app.state.engine)
            app.state.sessions = db.session_factory(app.state.engine)
            yield
        finally:
            if own_engine:
                app.state.engine.dispose()

    app = FastAPI(
        title="tunecache",
        version="0.1.0",
        summary="Persistent autotune cache for LLM inference fleets",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_upload_bytes)
    for router in (health.router, tunings.router, artifacts.router):
        app.include_router(router, prefix="/v1")
    return app
