"""``/v1/health``: up or down for anyone; details for a caller with a token."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text

from tunecache.contract import Health
from tunecache.service import db
from tunecache.service.deps import SessionDep
from tunecache.service.policy import PublicCaller

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, response_model_exclude_none=True)
def health(session: SessionDep, request: Request, caller: PublicCaller) -> Health:
    """Liveness and readiness: the database answers (else 503).

    Open to anyone, who learns only ``{"status": "ok"}``. With a valid token of any scope
    the answer also says which database, its schema revision, and whether this node runs
    tuning jobs: ``{"status": "ok", "database": "sqlite"|"postgresql", "schema_revision":
    "0006", "worker": {"enabled": true, "gpu_name": "NVIDIA H200", "arch": "sm90", ...}}``.
    """
    connection = session.connection()  # the request's one connection answers both questions
    connection.execute(text("SELECT 1"))
    if caller.anonymous:
        return Health(status="ok")
    return Health(
        status="ok",
        database=connection.dialect.name,
        schema_revision=db.revision_of(connection),
        worker=request.app.state.worker_status,
    )
