"""JSON bodies for every error the API can answer with, including unexpected ones."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
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
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each invalid field (``detail[].loc``), even when the bad input was NaN."""
    return JSONResponse(status_code=422, content={"detail": _json_safe(jsonable_encoder(exc.errors()))})


async def _database_unavailable(request: Request, exc: OperationalError) -> JSONResponse:
    log.error("database unavailable: %s", exc)
    return JSONResponse(status_code=503, content={"detail": f"database unavailable: {str(exc.orig).splitlines()[0]}"})


async def _database_busy(request: Request, exc: PoolTimeout) -> JSONResponse:
    log.error("no database connection free: %s", exc)
    return JSONResponse(status_code=503, content={"detail": "database busy: no connection free, try again"},
                        headers={"Retry-After": "5"})


async def _database_refused(request: Request, exc: DBAPIError) -> JSONResponse:
    log.error("database refused a statement: %s", exc)
    return JSONResponse(status_code=400, content={"detail": f"database refused the request: {str(exc.orig).splitlines()[0]}"})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(status_code=500, content={"detail": f"internal error: {type(exc).__name__}"})


def install_error_handlers(app: FastAPI) -> None:
    """422 for invalid requests, 503 when the database is unreachable, 400 for values the
    database refuses, and a JSON 500 for anything else (never a bare text page)."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(PoolTimeout, _database_busy)
    app.add_exception_handler(DBAPIError, _database_refused)
    app.add_exception_handler(Exception, _unexpected)
