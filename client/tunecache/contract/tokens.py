"""Tokens (their scopes, creating and listing them) and the audit log of writes."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac

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


#: A token's id: ``tc_<id>_<secret>``'s middle part, not a secret (the service finds a token by it).
TOKEN_ID_PATTERN = r"^[0-9a-f]{16}$"
#: A client's challenge for :func:`token_proof`: 32 to 128 hex digits.
CHALLENGE_PATTERN = r"^[0-9a-f]{32,128}$"


class TokenProof(BaseModel):
    """Answer of ``GET /v1/token-proof``: :func:`token_proof` of the token asked about (of a
    random key for a token the service does not hold, so the answer never tells which exist)."""

    proof: str = Field(pattern=r"^[0-9a-f]{64}$")


class WhoAmI(BaseModel):
    """Answer of ``GET /v1/whoami``: who the service takes the caller for, and which service it is.

    ``name`` and ``scope`` of the token sent; ``anonymous`` and no scope without one, or for
    a token the service does not know (unknown, revoked, malformed): it is then read as none."""

    name: str = Field(max_length=64)
    scope: Scope | None = None
    server_version: str = Field(max_length=64, description="the service's tunecache-server version")

    @property
    def anonymous(self) -> bool:
        return self.scope is None


def token_proof(secret_sha256: str, challenge: str, host: str, port: int) -> str:
    """What a service proves it holds a token with, without the token travelling: HMAC-SHA256
    keyed with the sha256 (hex) of the token's secret (all the service stores of it) over the
    client's ``challenge`` and the address the service listens on (``host`` as it was told
    to listen, ``port``). A client that holds the token computes the same and sends the token
    only where they match (the local admin token, :mod:`tunecache.store.http.local_token`); bound
    to the listening address, the proof of a real service relayed by a listener elsewhere
    does not match."""
    message = f"tunecache token proof\n{challenge}\n{host}\n{port}".encode()
    return hmac.new(secret_sha256.encode(), message, hashlib.sha256).hexdigest()


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
