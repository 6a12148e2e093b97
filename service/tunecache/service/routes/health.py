from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text

from tunecache.service import db
from tunecache.service.deps import SessionDep
from tunecache.service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health(session: SessionDep, request: Request) -> Health:
    """Liveness and readiness: the database answers, its schema revision, and whether this
    node runs tuning jobs (a node without a GPU says so and still serves lookups).

    Returns 200 ``{"status": "ok", "database": "sqlite"|"postgresql", "schema_revision": "0002",
    "worker": {"enabled": true, "gpu_name": "NVIDIA H200", "arch": "sm90", ...}}``.
    """
    session.execute(text("SELECT 1"))
    bind = session.get_bind()
    return Health(
        status="ok",
        database=bind.dialect.name,
        schema_revision=db.current_revision(bind),
        worker=request.app.state.worker_status,
    )
