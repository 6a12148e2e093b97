"""Bearer tokens: creation, listing, revocation and checking (table ``api_tokens``).

A token is ``tc_<token id: 16 hex>_<secret>``. Only the sha256 of the secret is stored;
a presented token is found by its id and its secret's hash compared in constant time
(``hmac.compare_digest``). Functions take the caller's session and never commit.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from tunecache.contract import Scope, TokenCreated, TokenRead
from tunecache.contract.tokens import token_proof
from tunecache.service.models import ApiToken, utcnow

_TOKEN = re.compile(r"^tc_([0-9a-f]{16})_([A-Za-z0-9_-]{20,128})$")
#: ``last_used_at`` is written at most this often per token (not on every request).
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class Caller:
    """Who made a request: a token's name and scope, or ``anonymous`` (no token, on a
    route open to anyone)."""

    name: str
    scope: Scope | None

    @property
    def anonymous(self) -> bool:
        return self.scope is None


ANONYMOUS = Caller(name="anonymous", scope=None)


class TokenNameTaken(ValueError):
    """A token of that name exists (revoked ones keep their names: the audit log names them)."""


def _secret_sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _read(row: ApiToken) -> TokenRead:
    return TokenRead(name=row.name, scope=Scope(row.scope), created_at=row.created_at, last_used_at=row.last_used_at,
                     revoked_at=row.revoked_at, created_by=row.created_by)


def create_token(session: Session, name: str, scope: Scope, created_by: str | None = None) -> TokenCreated:
    """A new token; its secret is in the answer and nowhere else.

    Raises:
        TokenNameTaken: ``name`` is used by another token, live or revoked.
    """
    if session.scalar(select(exists().where(ApiToken.name == name))):
        raise TokenNameTaken(f"a token named {name!r} exists already")
    token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    row = ApiToken(token_id=token_id, name=name, scope=scope.value, secret_sha256=_secret_sha256(secret),
                   created_at=utcnow(), created_by=created_by)
    session.add(row)
    session.flush()
    return TokenCreated(**_read(row).model_dump(), token=f"tc_{token_id}_{secret}")


def list_tokens(session: Session) -> list[TokenRead]:
    """Every token, live and revoked, oldest first (no secrets)."""
    return [_read(row) for row in session.scalars(select(ApiToken).order_by(ApiToken.id))]


class LastAdminToken(ValueError):
    """Revoking this token would leave the service without a live admin token."""


def revoke_token(session: Session, name: str) -> TokenRead | None:
    """Revoke the token named ``name`` (already revoked: unchanged); ``None`` if there is none.

    Raises:
        LastAdminToken: it is the last live ``admin`` token (nobody could manage tokens or
            request tunings after it); create another admin token first.
    """
    row = session.scalar(select(ApiToken).where(ApiToken.name == name))
    if row is None:
        return None
    if row.revoked_at is None and row.scope == Scope.ADMIN.value:
        others = select(func.count()).where(ApiToken.scope == Scope.ADMIN.value, ApiToken.revoked_at.is_(None),
                                            ApiToken.id != row.id)
        if not session.scalar(others):
            raise LastAdminToken(f"{name!r} is the last live admin token; create another admin token before revoking it")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return _read(row)


def authenticate(session: Session, presented: str) -> Caller | None:
    """The caller a presented token stands for, or ``None`` when it is malformed, unknown
    or revoked. Notes the use in ``last_used_at`` (at most once a minute per token)."""
    match = _TOKEN.match(presented)
    if match is None:
        return None
    row = session.scalar(select(ApiToken).where(ApiToken.token_id == match[1]))
    # The comparison runs for unknown ids too, so timing does not tell which ids exist.
    stored = row.secret_sha256 if row is not None else "0" * 64
    if not hmac.compare_digest(stored, _secret_sha256(match[2])) or row is None or row.revoked_at is not None:
        return None
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        row.last_used_at = now
    return Caller(name=row.name, scope=Scope(row.scope))


#: The key of the proofs for tokens this process does not hold: random, so that an answer
#: never tells which token ids exist.
_NO_SUCH_TOKEN_KEY = secrets.token_hex(32)


def prove_token(session: Session, token_id: str, challenge: str, host: str, port: int) -> str:
    """:func:`tunecache.contract.tokens.token_proof` of the live token ``token_id`` (of a
    random key when there is none, or it is revoked), for a client deciding whether to send
    it here: nothing of the token leaves the service."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_id == token_id))
    key = row.secret_sha256 if row is not None and row.revoked_at is None else _NO_SUCH_TOKEN_KEY
    return token_proof(key, challenge, host, port)


def is_live(session: Session, presented: str) -> bool:
    """Whether ``presented`` is a live token of this database (read only: no use is noted)."""
    match = _TOKEN.match(presented)
    if match is None:
        return False
    row = session.scalar(select(ApiToken).where(ApiToken.token_id == match[1]))
    stored = row.secret_sha256 if row is not None else "0" * 64
    return hmac.compare_digest(stored, _secret_sha256(match[2])) and row is not None and row.revoked_at is None


def bootstrap_admin_token(session: Session, path: Path) -> bool:
    """On a service with no tokens at all, create the ``admin`` token and write it to
    ``path`` (mode 0600; a file left there from an earlier database is replaced: its token
    no longer exists). Returns whether it did. The file is staged under a random name
    created exclusively without following links (``tempfile.mkstemp``) and renamed into
    place, so another user who can write the directory never gets to read it.

    Replicas racing on one database: the unique name lets one of them create it; the
    others find it there and write nothing.

    Raises:
        OSError: ``path`` cannot be written (the transaction should then roll back).
    """
    if session.scalar(select(exists().where(ApiToken.id.is_not(None)))):
        return False
    created = create_token(session, "admin", Scope.ADMIN, created_by="tunecache serve (first start)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Staged under a name of mkstemp's: random, created O_CREAT|O_EXCL|O_NOFOLLOW with mode
    # 0600, so in a data dir another user can write, nothing of theirs (a link, a file they
    # keep open) is ever written through; the rename replaces a link at ``path`` itself.
    fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(created.token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, path)
    except OSError:
        Path(staged).unlink(missing_ok=True)  # its token is rolled back with the transaction
        raise
    return True
