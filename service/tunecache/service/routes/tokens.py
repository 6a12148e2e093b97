"""``/v1/tokens``: bearer tokens and their scopes (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request

from tunecache.contract import TOKEN_NAME_PATTERN, ErrorBody, TokenCreate, TokenCreated, TokenRead
from tunecache.contract.tokens import CHALLENGE_PATTERN, TOKEN_ID_PATTERN, TokenProof, WhoAmI
from tunecache.service import tokens
from tunecache.service.deps import SessionDep, SettingsDep
from tunecache.service.policy import AdminCaller, PublicCaller

router = APIRouter(prefix="/tokens", tags=["tokens"])
#: ``/v1/token-proof`` and ``/v1/whoami``: beside ``/v1/tokens/{name}``, whose names they would shadow.
proof_router = APIRouter(tags=["tokens"])

TokenName = Annotated[str, Path(pattern=TOKEN_NAME_PATTERN, description="the token's name")]


@router.post("", response_model=TokenCreated, status_code=201,
             responses={409: {"model": ErrorBody, "description": "a token of that name exists (live or revoked)"}})
def create_token(body: TokenCreate, session: SessionDep, caller: AdminCaller, request: Request) -> TokenCreated:
    """Create a token of ``scope`` (``read``, ``push``, ``tune``, ``admin``) named ``name``.

    The answer carries the secret (``token``) this once; the service keeps only its sha256.
    409 when the name is taken (names are never reused: the audit log refers to them).
    """
    try:
        created = tokens.create_token(session, body.name, body.scope, created_by=caller.name)
    except tokens.TokenNameTaken as exc:
        raise HTTPException(409, detail=str(exc)) from None
    request.state.audit_detail = f"created token {created.name!r} ({created.scope})"
    return created


@proof_router.get("/token-proof", response_model=TokenProof)
def prove_token(
    session: SessionDep,
    settings: SettingsDep,
    _caller: PublicCaller,
    token_id: Annotated[str, Query(pattern=TOKEN_ID_PATTERN, description="the token's id (`tc_<id>_...`)")],
    challenge: Annotated[str, Query(pattern=CHALLENGE_PATTERN, description="the client's random challenge (hex)")],
) -> TokenProof:
    """Prove this service holds the token ``token_id`` without it travelling: the HMAC of the
    challenge and the address this service listens on, keyed with the sha256 of the token's
    secret (:func:`tunecache.contract.tokens.token_proof`; of a random key for a token it
    does not hold). Open to anyone: a client on the service's machine asks before it sends
    the admin token that ``tunecache serve`` wrote there, so that token goes to that service
    only, never to another listener or another service (``tunecache.store.http.local_token``)."""
    return TokenProof(proof=tokens.prove_token(session, token_id, challenge, settings.host, settings.port))


@proof_router.get("/whoami", response_model=WhoAmI)
def whoami(caller: PublicCaller, request: Request) -> WhoAmI:
    """Who the service takes the caller for: the name and scope of the token sent, or
    ``anonymous`` (no token, or one it does not know: unknown, revoked, malformed), and the
    service's version. Open to anyone, who learns nothing but what their own token is
    (``tunecache status`` asks it)."""
    return WhoAmI(name=caller.name, scope=caller.scope, server_version=str(request.app.version)[:64])


@router.get("", response_model=list[TokenRead])
def list_tokens(session: SessionDep, _caller: AdminCaller) -> list[TokenRead]:
    """Every token, live and revoked, oldest first: name, scope, creation, last use
    (to within a minute), revocation. Never a secret."""
    return tokens.list_tokens(session)


@router.delete("/{name}", response_model=TokenRead,
               responses={404: {"model": ErrorBody, "description": "no token of that name"},
                          409: {"model": ErrorBody, "description": "the last live admin token"}})
def revoke_token(name: TokenName, session: SessionDep, _caller: AdminCaller, request: Request) -> TokenRead:
    """Revoke a token: writes with it fail at once, reads within
    ``TUNECACHE_TOKEN_CACHE_SECONDS``. Revoking a revoked token changes nothing; the last
    live admin token cannot be revoked (409)."""
    try:
        revoked = tokens.revoke_token(session, name)
    except tokens.LastAdminToken as exc:
        raise HTTPException(409, detail=str(exc)) from None
    if revoked is None:
        raise HTTPException(404, detail=f"no token named {name!r}")
    request.state.audit_detail = f"revoked token {name!r}"
    return revoked
