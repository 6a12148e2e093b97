"""``/v1/tunings``: record runs, look up the current tuning for a pod, list history."""

from __future__ import annotations

from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import (
    MAX_ID,
    ErrorBody,
    Scope,
    LookupMiss,
    LookupRequest,
    TuningRunCreate,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
)
from tunecache.service import repository
from tunecache.service.deps import SessionDep
from tunecache.service.policy import PushCaller, ReadCaller

router = APIRouter(prefix="/tunings", tags=["tunings"])


@router.post("", response_model=TuningRunRead, status_code=201)
def record_tuning(body: TuningRunCreate, session: SessionDep, caller: PushCaller, request: Request) -> TuningRunRead:
    """Record one tuning run with its artifacts (uploaded before with ``PUT /v1/artifacts/{sha256}``).

    Needs a ``push`` token. With a ``tune`` or ``admin`` token, a succeeded run becomes
    the current tuning of its key and environment; with a ``push`` token it is stored as
    a pod's run (trigger ``pod``, unverified) and never becomes current: the token decides,
    never the body. Earlier runs stay in the history. Errors: 422 for an invalid body (pydantic names the field), for
    artifacts whose bytes were never uploaded (``missing`` lists their sha256), and for a
    succeeded run whose environment has fields FlashInfer reported as ``"unknown"``.
    """
    try:  # ArtifactsMissing: 422 with "missing" (tunecache.service.errors)
        run = repository.record_run(session, body, trusted=caller.scope.includes(Scope.TUNE), recorded_by=caller.name)
    except repository.IndeterminateEnvironment as exc:
        raise HTTPException(422, detail=str(exc)) from None
    request.state.audit_detail = (f"run {run.id} ({run.trigger}, {'verified' if run.verified else 'unverified'}"
                                  f"{', current' if run.is_current else ''}) of {run.key.model}")
    return run


@router.post(
    "/lookup",
    response_model=TuningRunRead,
    responses={
        404: {"model": LookupMiss, "description": "No usable tuning; the closest ones and how they differ"},
        503: {"model": ErrorBody, "description": "The database did not answer in time, or the service is saturated (Retry-After)"},
    },
)
async def lookup_tuning(body: LookupRequest, request: Request, _caller: ReadCaller) -> Response:
    """The current tuning for a pod's key and FlashInfer environment.

    Matching is exact on every key field and every field of FlashInfer's ``_metadata``
    (``flashinfer.autotuner._collect_metadata``), because ``AutoTuner.load_configs``
    rejects a file on any mismatch. 404 body: ``{"detail": "...", "closest": [{"run_id",
    "key", "environment_hash", "differences": [{"field", "stored", "yours"}]}]}``.

    The hot path of a boot: answered from the process's
    :class:`~tunecache.service.hot_path.LookupCache` while the tuning generation (read by
    a query that began after this request did, shared with the requests beside it) has
    not moved; otherwise computed in a unit of work of its own, once for all the requests
    that miss on the same key and environment at the same time. A database that does not
    answer within ``TUNECACHE_DB_STATEMENT_TIMEOUT`` + ``TUNECACHE_DB_POOL_TIMEOUT`` seconds
    (frozen, partitioned) gives 503 with ``Retry-After``.
    """
    state = request.app.state
    settings = state.settings
    try:
        with anyio.fail_after(settings.db_statement_timeout + settings.db_pool_timeout):
            generation = await state.generation_reader.current()
            answer = await state.lookup_cache.answer(
                generation, body.key, body.environment,
                lambda: anyio.to_thread.run_sync(_lookup_answer, state.sessions, body, abandon_on_cancel=True))
    except TimeoutError:  # a frozen database: the pod comes back later, the service stays up
        return JSONResponse(status_code=503, content={"detail": "database did not answer in time, try again"},
                            headers={"Retry-After": str(settings.retry_after_seconds)})
    return Response(content=answer[1], status_code=answer[0], media_type="application/json")


def _lookup_answer(sessions: sessionmaker[Session], body: LookupRequest) -> tuple[int, bytes]:
    """``(status, JSON body)`` of a lookup, computed in one transaction."""
    with sessions.begin() as session:
        result = repository.lookup(session, body.key, body.environment)
    return 404 if isinstance(result, LookupMiss) else 200, result.model_dump_json().encode()


@router.get("", response_model=TuningRunPage)
def list_tunings(session: SessionDep, filters: Annotated[TuningRunQuery, Query()], _caller: ReadCaller) -> TuningRunPage:
    """Tuning history, newest first, filtered by key fields and status
    (:class:`~tunecache.contract.TuningRunQuery`); ``current_only`` keeps the runs that are
    current for their key and environment. 422 names an unknown or invalid parameter."""
    return repository.list_runs(session, filters)


@router.get("/{run_id:int}", response_model=TuningRunRead, responses={404: {"model": ErrorBody, "description": "no such run"}})
def get_tuning(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, _caller: ReadCaller) -> TuningRunRead:
    """One run by id. 404 if there is none."""
    run = repository.get_run(session, run_id)
    if run is None:
        raise HTTPException(404, detail=f"no tuning run {run_id}")
    return run
