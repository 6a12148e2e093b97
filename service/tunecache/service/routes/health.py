from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text

from tunecache.contract import Health
from tunecache.service import db
from tunecache.service.deps import SessionDep

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health(session: SessionDep, request: Request) -> Health:
    """Liveness and readiness: the database answers, its schema revision, and whether this
    node runs tuning jobs (a node without a GPU says so and still serves lookups).

    Returns 200 ``{"status": "ok", "database": "sqlite"|"postgresql", "schema_revision": "0002",
    "worker": {"enabled": true, "gpu_name": "NVIDIA H200", "arch": "sm90", ...}}``.
    """
    connection = session.connection()  # the request's one connection answers both questions
    connection.execute(text("SELECT 1"))
    return Health(
        status="ok",
        database=connection.dialect.name,
        schema_revision=db.revision_of(connection),
        worker=request.app.state.worker_status,
    )
