"""Tokens (their scopes, creating and listing them) and the audit log of writes."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from tunecache.contract.identity import StrEnum


class Scope(StrEnum):
    """What a token may do; each scope includes the ones before it.

    * ``read``: lookups, artifact and history GETs (open to anyone unless the service sets
      ``TUNECACHE_READ_TOKEN_REQUIRED``).
    * ``push``: a pod's push-back: artifacts and runs stored unverified, never current.
    * ``tune``: GPU nodes: runs that may become current.
    * ``admin``: tokens, re-tune requests, the audit log.
    """

    READ = "read"
    PUSH = "push"
    TUNE = "tune"
    ADMIN = "admin"

    def includes(self, other: "Scope") -> bool:
        """Whether a token of this scope may do what ``other`` allows."""
        order = list(Scope)
        return order.index(self) >= order.index(other)


TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


class TokenCreate(BaseModel):
    """Body of ``POST /v1/tokens``: a new token's name (unique) and scope."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=TOKEN_NAME_PATTERN, description="letters, digits, _ . @ -; at most 64")
    scope: Scope


class TokenRead(BaseModel):
    """A token as listed (``GET /v1/tokens``): never its secret, which is stored as a hash only."""

    name: str
    scope: Scope
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    """Last use, to within a minute."""
    revoked_at: dt.datetime | None
    created_by: str | None


class TokenCreated(TokenRead):
    """Answer of ``POST /v1/tokens``: the secret, shown this once."""

    token: str


class AuditEventRead(BaseModel):
    """One write to the service (``GET /v1/audit``): who (the token's name and scope), what
    (method, path, and what it did), when."""

    id: int
    at: dt.datetime
    token_name: str
    scope: Scope
    method: str
    path: str
    detail: str | None


class AuditPage(BaseModel):
    """A page of audit events, newest first; ``next_before`` continues it (``before=``)."""

    events: list[AuditEventRead]
    next_before: int | None
