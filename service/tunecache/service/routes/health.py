from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from tunecache.service import db
from tunecache.service.deps import SessionDep
from tunecache.service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health(session: SessionDep) -> Health:
    """Liveness and readiness: the database answers and its schema revision.

    Returns 200 ``{"status": "ok", "database": "sqlite"|"postgresql", "schema_revision": "0001"}``.
    """
    session.execute(text("SELECT 1"))
    bind = session.get_bind()
    return Health(status="ok", database=bind.dialect.name, schema_revision=db.current_revision(bind))
