"""The audit log (table ``audit_events``): every write with the token that made it.

Written by the write policies (:mod:`tunecache.service.policy`) in the request's own
transaction, so an event exists exactly when its write does. Never commits.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tunecache.contract import AuditEventRead, AuditPage, Scope
from tunecache.service.models import AuditEvent, utcnow
from tunecache.service.tokens import Caller

_DETAIL_CHARS = 1024
_PATH_CHARS = 512


def record(session: Session, caller: Caller, method: str, path: str, detail: str | None = None) -> None:
    """Add one event: ``caller``'s token name and scope (a write's caller always has one),
    the request's method and path, and what the write did (``detail``, cut to 1,024 characters)."""
    session.add(AuditEvent(at=utcnow(), token_name=caller.name, scope=caller.scope.value,
                           method=method[:8], path=path[:_PATH_CHARS], detail=detail[:_DETAIL_CHARS] if detail else None))
    session.flush()


def list_events(session: Session, limit: int = 100, before: int | None = None, token_name: str | None = None) -> AuditPage:
    """Events newest first, at most ``limit``; ``before`` (an event id) continues a page;
    ``token_name`` keeps one token's."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit + 1)
    if before is not None:
        query = query.where(AuditEvent.id < before)
    if token_name is not None:
        query = query.where(AuditEvent.token_name == token_name)
    rows = list(session.scalars(query))
    events = [AuditEventRead(id=r.id, at=r.at, token_name=r.token_name, scope=Scope(r.scope), method=r.method,
                             path=r.path, detail=r.detail) for r in rows[:limit]]
    return AuditPage(events=events, next_before=events[-1].id if len(rows) > limit else None)
