"""JSON bodies for every error the API can answer with, including unexpected ones.

Database trouble is answered 503 with ``Retry-After`` and a body that names no host,
port or driver message (those go to the log); invalid input is 422 without echoing
more than a short excerpt of what was sent."""

from __future__ import annotations

import functools
import logging
import math
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tunecache.contract import ErrorBody
from tunecache.service.artifact_store import ArtifactStoreUnavailable, StoreNotConfigured
from tunecache.service.jobs import JobOptionsConflict
from tunecache.service.publishing import PromotionRefused, RunNotFound
from tunecache.service.run_diff import CannotDiff, DiffsBusy, RunsNotFound
from tunecache.store import ArtifactsMissing
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

log = logging.getLogger("tunecache")


def _json_safe(value: Any) -> Any:
    """Replace values JSON cannot hold (NaN, Infinity, lone UTF-16 surrogates) by their text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}  # keys too: a surrogate key answered 500
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


#: Characters of a rejected value echoed back in a 422.
ECHO_CHARS = 100


def _excerpt(value: Any) -> Any:
    """A short stand-in for a rejected input: never the whole of an unbounded value."""
    if isinstance(value, str) and len(value) > ECHO_CHARS:
        return value[:ECHO_CHARS] + f"... ({len(value)} characters)"
    if isinstance(value, (dict, list)):
        text = repr(value)
        return text[:ECHO_CHARS] + "..." if len(text) > ECHO_CHARS else value
    return value


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each invalid field (``detail[].loc``), even when the bad input was NaN."""
    errors = [{**e, "input": _excerpt(e["input"])} if "input" in e else e for e in exc.errors()[:20]]
    return JSONResponse(status_code=422, content={"detail": _json_safe(jsonable_encoder(errors))})


#: The error answers every route may give, for the OpenAPI document (one body schema).
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not JSON the service can read"},
    401: {"model": ErrorBody, "description": "No token, or one that is unknown, revoked or malformed (WWW-Authenticate: Bearer)"},
    403: {"model": ErrorBody, "description": "The token's scope does not allow this route; the answer names the scope needed"},
    413: {"model": ErrorBody, "description": "The body is over its limit (TUNECACHE_MAX_JSON_BYTES, TUNECACHE_MAX_UPLOAD_BYTES)"},
    422: {"model": ErrorBody, "description": "Invalid request: each invalid field, or the rule it breaks"},
    500: {"model": ErrorBody, "description": "Unexpected error (logged)"},
    503: {"model": ErrorBody, "description": "Saturated, or the database is unavailable or too slow: retry after Retry-After"},
}


#: ``(path regex, methods)`` of every route of an app.
PathMethods = list[tuple[re.Pattern[str], frozenset[str]]]


async def _http_error(path_methods: PathMethods, request: Request, exc: StarletteHTTPException):
    """Starlette's HTTP errors as JSON; a 405 lists in ``Allow`` every method of every route
    of the path (``path_methods``: Starlette would name one route's only)."""
    if exc.status_code == 404 and exc.detail == "Not Found":  # no route: say which part of the path is wrong
        return JSONResponse(status_code=404, content={"detail": _no_route(path_methods, request)}, headers=exc.headers)
    if exc.status_code != 405:
        return await http_exception_handler(request, exc)
    allowed: set[str] = set()
    for regex, methods in path_methods:
        if regex.match(request.url.path):
            allowed |= methods
    return JSONResponse(status_code=405, content={"detail": f"method {request.method} not allowed here"},
                        headers={"Allow": ", ".join(sorted(allowed))})


def _no_route(path_methods: PathMethods, request: Request) -> str:
    """Why no route has this path: a segment where a route takes an id (``/v1/tunings/abc``:
    ids are positive whole numbers), else only that none has it."""
    path = request.url.path
    segments = path.split("/")
    for i, segment in enumerate(segments):
        if segment and not segment.isdigit():
            probe = "/".join([*segments[:i], "1", *segments[i + 1:]])
            if any(regex.match(probe) for regex, _ in path_methods):
                return (f"no such route: {_json_safe(path)[:256]} ({_json_safe(segment)[:64]!r} is not an id: ids are "
                        "positive whole numbers)")
    return f"no such route: {_json_safe(path)[:256]}"


#: PostgreSQL's SQLSTATE for a full disk (``disk_full``, class 53: insufficient resources).
_PG_DISK_FULL = "53100"


def disk_full(exc: DBAPIError, app_state: Any) -> str | None:
    """What to say when the database failed because its disk is full (SQLite's SQLITE_FULL,
    "database or disk is full"; PostgreSQL's SQLSTATE 53100), naming the directory where it
    can be told (a SQLite file's; PostgreSQL's is on its own server); ``None`` otherwise."""
    orig = getattr(exc, "orig", None)
    sqlite_full = getattr(orig, "sqlite_errorname", None) == "SQLITE_FULL" or "database or disk is full" in str(orig)
    if getattr(orig, "sqlstate", None) == _PG_DISK_FULL or getattr(orig, "pgcode", None) == _PG_DISK_FULL:
        return "database disk full: the PostgreSQL server has no room left to write; free space there (nothing was stored)"
    if not sqlite_full:
        return None
    state = getattr(app_state, "tunecache", None)
    engine = getattr(state, "engine", None)
    where = None
    if engine is not None and engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        where = Path(engine.url.database).resolve().parent
    return (f"database disk full: no room left to write the database{f' in {where}' if where else ''}; "
            "free space there (nothing was stored)")


def install_error_handlers(app: FastAPI, path_methods: PathMethods, retry_after_s: int = 1) -> None:
    """The app's error answers; ``path_methods``: its routes' paths and methods (the ``Allow``
    of a 405, the detail of a 404). 422 for invalid requests (and for a run naming artifacts never uploaded: its
    ``missing`` lists their sha256; raised, so the request's transaction rolls back), 409
    with a :class:`~tunecache.contract.JobConflict` body for a job request whose options
    differ from its key's active job (raised too: nothing written, nothing audited), 503 with ``Retry-After`` when the database is unreachable,
    busy or too slow, 400 for values the database refuses, and a JSON 500 for anything
    else (never a bare text page). A run diff (:mod:`tunecache.service.run_diff`): 404 for
    a run that does not exist, 422 for one without a readable file, 503 with
    ``Retry-After`` while the process computes another."""
    retry_after = {"Retry-After": str(retry_after_s)}

    async def database_unavailable(request: Request, exc: OperationalError) -> JSONResponse:
        log.error("database unavailable: %s", exc)
        full = disk_full(exc, request.app.state)
        return JSONResponse(status_code=503, content={"detail": full or "database unavailable, try again"},
                            headers=retry_after)

    async def database_busy(request: Request, exc: PoolTimeout) -> JSONResponse:
        log.warning("no database connection free: %s", exc)
        return JSONResponse(status_code=503, content={"detail": "database busy: no connection free, try again"},
                            headers=retry_after)

    async def database_refused(request: Request, exc: DBAPIError) -> JSONResponse:
        log.error("database refused a statement: %s", exc)
        return JSONResponse(status_code=400, content={"detail": "the database refused a value of the request"})

    async def artifacts_missing(request: Request, exc: ArtifactsMissing) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc), "missing": exc.missing})

    async def job_options_conflict(request: Request, exc: JobOptionsConflict) -> JSONResponse:
        return JSONResponse(status_code=409, content=exc.conflict.model_dump(mode="json"))

    async def store_unavailable(request: Request, exc: ArtifactStoreUnavailable) -> JSONResponse:
        log.error("artifact store unavailable: %s", exc)
        return JSONResponse(status_code=503, content={"detail": "artifact store unavailable, try again"},
                            headers=retry_after)

    async def store_not_configured(request: Request, exc: StoreNotConfigured) -> JSONResponse:
        # this replica lacks the setting another has (not the client's fault, nor the bytes'): 503 naming it
        log.error("%s", exc)
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    async def diff_refused(request: Request, exc: RunsNotFound | CannotDiff | DiffsBusy) -> JSONResponse:
        status = 404 if isinstance(exc, RunsNotFound) else 422 if isinstance(exc, CannotDiff) else 503
        return JSONResponse(status_code=status, content={"detail": str(exc)},
                            headers=retry_after if status == 503 else None)

    async def promotion_refused(request: Request, exc: RunNotFound | PromotionRefused) -> JSONResponse:
        return JSONResponse(status_code=404 if isinstance(exc, RunNotFound) else 409, content={"detail": str(exc)})

    app.add_exception_handler(ArtifactStoreUnavailable, store_unavailable)
    app.add_exception_handler(StoreNotConfigured, store_not_configured)
    app.add_exception_handler(RunNotFound, promotion_refused)
    app.add_exception_handler(PromotionRefused, promotion_refused)
    for refusal in (RunsNotFound, CannotDiff, DiffsBusy):
        app.add_exception_handler(refusal, diff_refused)
    app.add_exception_handler(ArtifactsMissing, artifacts_missing)
    app.add_exception_handler(JobOptionsConflict, job_options_conflict)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, functools.partial(_http_error, path_methods))
    app.add_exception_handler(OperationalError, database_unavailable)
    app.add_exception_handler(PoolTimeout, database_busy)
    app.add_exception_handler(DBAPIError, database_refused)
    app.add_exception_handler(Exception, _unexpected)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(status_code=500, content={"detail": f"internal error: {type(exc).__name__}"})
