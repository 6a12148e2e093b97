"""Who may call each route: FastAPI security dependencies, one per route.

Every route of the app declares exactly one :class:`CallerPolicy` (``tests/test_policy``
enumerates the routes and fails on one without):

* :data:`PUBLIC`: anyone (``GET /v1/health``, which says more to a caller with a token).
* :data:`READ`: lookups, artifact and history GETs; open to anyone unless
  ``TUNECACHE_READ_TOKEN_REQUIRED`` is set, then a token of any scope (while open, a token
  the service does not know is read as none). Checked without
  touching the database while a token's answer is cached (``TUNECACHE_TOKEN_CACHE_SECONDS``),
  so a boot storm stays off the database.
* :func:`requires` (``push``, ``tune``, ``admin``): writes. The token is checked against
  the database on every request (a revoked token stops at once), in a short transaction
  of its own (the request's transaction takes its connection only where the route runs),
  and the write is recorded in the audit log (``audit_events``) in that same
  transaction: with the write, or not at all.

Answers: 401 (no token, or one that is unknown, revoked or malformed, where one is needed; with
``WWW-Authenticate: Bearer``) and 403 (a token whose scope is too small), both as JSON
``{"detail": ...}`` naming the scope the route needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import anyio
import anyio.to_thread
from cachetools import TTLCache
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from tunecache.contract import Scope
from tunecache.service import audit, tokens
from tunecache.service.deps import SessionDep
from tunecache.service.tokens import ANONYMOUS, Caller
from tunecache.service.state import state_of

bearer = HTTPBearer(auto_error=False, description="a tunecache token: tc_<id>_<secret>")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def _invalid(needed: Scope) -> HTTPException:
    return _unauthorized(f"the bearer token is not valid (unknown, revoked or malformed); this route needs a token "
                         f"with scope {needed!s}")


def _check_scope(caller: Caller, needed: Scope, request: Request) -> None:
    if caller.scope is None or not caller.scope.includes(needed):
        raise HTTPException(403, detail=f"token {caller.name!r} has scope {caller.scope}; "
                                        f"{request.method} {request.url.path} needs {needed!s}")


class CallerPolicy:
    """Base of the route policies: ``scope`` is what the route needs (``None``: nothing)."""

    scope: Scope | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scope})"


class _Public(CallerPolicy):
    """Anyone; a valid token makes the caller known (an invalid one is ignored, and so is
    one the database could not check within ``TUNECACHE_HEALTH_TIMEOUT``: a public route
    such as ``/v1/health`` answers in time whatever the database does). Sets
    ``request.state.deadline`` (``anyio.current_time()`` by which the route answers)."""

    async def __call__(self, request: Request, credentials: Credentials) -> Caller:
        state = state_of(request.app)
        request.state.deadline = anyio.current_time() + state.settings.health_timeout
        if credentials is None:
            return ANONYMOUS
        presented = credentials.credentials
        caller = state.token_cache.get(presented)
        if caller is not None:
            return caller
        try:
            with anyio.fail_after(state.settings.health_timeout):
                caller = await anyio.to_thread.run_sync(_authenticate_in_own_session, state.sessions, presented,
                                                        abandon_on_cancel=True)
        except (TimeoutError, SQLAlchemyError):
            return ANONYMOUS
        if caller is None:
            return ANONYMOUS
        state.token_cache[presented] = caller
        return caller


class _Read(CallerPolicy):
    """Reads: open unless ``read_token_required``. With reads open, a token the service does
    not know (unknown, revoked, malformed) is read as no token: an open read never fails
    because of what a client sent along (a token of another service on the same machine, an
    old one); with reads behind a token, it is a 401."""

    scope = Scope.READ

    async def __call__(self, request: Request, credentials: Credentials) -> Caller:
        state = state_of(request.app)
        if credentials is None:
            if state.settings.read_token_required:
                raise _unauthorized("reads on this service need a token with scope read or above: "
                                    "send Authorization: Bearer <token>")
            return ANONYMOUS
        presented = credentials.credentials
        cache: TTLCache = state.token_cache
        caller = cache.get(presented)
        if caller is None:
            caller = await run_in_threadpool(_authenticate_in_own_session, state.sessions, presented)
            if caller is None:
                if not state.settings.read_token_required:
                    return ANONYMOUS
                raise _invalid(Scope.READ)
            cache[presented] = caller
        return caller


def _authenticate_in_own_session(sessions, presented: str) -> Caller | None:
    session: Session
    with sessions.begin() as session:
        return tokens.authenticate(session, presented)


class _Write(CallerPolicy):
    """Writes (and admin reads): a token of ``scope`` or above, checked in the request's
    transaction; a write is audited in it when the route returns without an error."""

    def __init__(self, scope: Scope):
        self.scope = scope

    def __call__(self, request: Request, session: SessionDep, credentials: Credentials) -> Iterator[Caller]:
        if credentials is None:
            raise _unauthorized(f"{request.method} {request.url.path} needs a token with scope {self.scope!s}: "
                                f"send Authorization: Bearer <token>")
        # In a short transaction of its own: the request's session takes its connection in
        # the route's thread, not here (a connection held while the request waits for a
        # thread is one the threads running routes may not find: 503 no connection free).
        caller = _authenticate_in_own_session(state_of(request.app).sessions, credentials.credentials)
        if caller is None:
            raise _invalid(self.scope)
        _check_scope(caller, self.scope, request)
        yield caller
        if request.method not in ("GET", "HEAD"):  # admin reads (tokens, the audit log) are not writes
            audit.record(session, caller, request.method, request.url.path, getattr(request.state, "audit_detail", None))


def policy_of(route) -> CallerPolicy | None:
    """The caller policy a route declares (found among its dependencies), or ``None``."""
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        if isinstance(dependant.call, CallerPolicy):
            return dependant.call
        stack.extend(dependant.dependencies)
    return None


PUBLIC = _Public()
READ = _Read()
_WRITES = {scope: _Write(scope) for scope in (Scope.PUSH, Scope.TUNE, Scope.ADMIN)}


def requires(scope: Scope) -> CallerPolicy:
    """The policy of a write that needs ``scope`` (``push``, ``tune`` or ``admin``)."""
    return _WRITES[scope]


PublicCaller = Annotated[Caller, Depends(PUBLIC)]
ReadCaller = Annotated[Caller, Depends(READ)]
PushCaller = Annotated[Caller, Depends(requires(Scope.PUSH), scope="function")]
TuneCaller = Annotated[Caller, Depends(requires(Scope.TUNE), scope="function")]
AdminCaller = Annotated[Caller, Depends(requires(Scope.ADMIN), scope="function")]
