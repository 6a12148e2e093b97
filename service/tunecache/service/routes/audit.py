"""``/v1/audit``: who wrote what, when (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tunecache.contract import MAX_ID, TOKEN_NAME_PATTERN, AuditPage
from tunecache.service import audit
from tunecache.service.deps import SessionDep
from tunecache.service.policy import AdminCaller

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("", response_model=AuditPage)
def list_audit_events(
    session: SessionDep,
    _caller: AdminCaller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="continue below this event id")] = None,
    token_name: Annotated[str | None, Query(pattern=TOKEN_NAME_PATTERN)] = None,
) -> AuditPage:
    """Writes, newest first: the token's name and scope, method, path and what it did.
    ``next_before`` continues the page. Reading the log is itself not logged."""
    return audit.list_events(session, limit=limit, before=before, token_name=token_name)
