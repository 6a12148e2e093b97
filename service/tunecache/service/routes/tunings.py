"""``/v1/tunings``: record runs, look up the current tuning for a pod, list history, diff two runs."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import (
    MAX_ID,
    RUN_CSV_COLUMNS,
    ErrorBody,
    Scope,
    LookupMiss,
    LookupRequest,
    PromoteRequest,
    RunRetired,
    RunVerification,
    compiled_summary,
    TuningRunCreate,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
    TuningRunDiff,
    run_csv_row,
)
from tunecache.formats.dependencies import image_of
from tunecache.service import redaction, run_diff
from tunecache.service import publishing, repository, retiring
from tunecache.service import metrics
from tunecache.service.deps import SessionDep, SettingsDep
from tunecache.service.policy import AdminCaller, PushCaller, ReadCaller, TuneCaller
from tunecache.service.state import ServiceState, state_of

router = APIRouter(prefix="/tunings", tags=["tunings"])


@router.post("", response_model=TuningRunRead, status_code=201,
             responses={403: {"model": ErrorBody, "description": "force=true without an admin token"},
                        409: {"model": ErrorBody, "description": "trusted_signature=true and the run is not signed by "
                                                                 "a key this service trusts: nothing was recorded"}})
def record_tuning(body: TuningRunCreate, session: SessionDep, caller: PushCaller, request: Request,
                  force: Annotated[bool, Query(description="skip the promotion policy (admin only, audited)")] = False,
                  trusted_signature: Annotated[bool, Query(
                      description="record the run only if its signature checks against this service's trusted keys "
                                  "(TUNECACHE_TRUSTED_KEYS), else 409 and nothing is recorded (tunecache import)")] = False,
                  ) -> Response:
    """Record one tuning run with its artifacts (uploaded before with ``PUT /v1/artifacts/{sha256}``).

    Needs a ``push`` token. With a ``tune`` or ``admin`` token, a succeeded run becomes
    the current tuning of its key and environment when the promotion policy lets it
    (:data:`tunecache.service.publishing.RECORD_POLICY`: with ``TUNECACHE_TRUSTED_KEYS`` on the
    service, signed by one of those keys; not fewer entries than the current run; no
    regression the run diff flags against it); a run held back is stored, not current, with
    the reason in ``held`` (and the audit log); ``force=true`` (admin) skips the policy.
    With a ``push`` token it is stored as a pod's run (trigger ``pod``, unverified) and never
    becomes current: the token decides, never the body. Earlier runs stay in the history.
    Errors: 422 for an invalid body (pydantic names the field), for artifacts whose bytes
    were never uploaded (``missing`` lists their sha256), for a ``flashinfer_autotune_v1``
    artifact FlashInfer's loader could not load, and for a succeeded run whose environment
    has fields FlashInfer reported as ``"unknown"``; 403 for ``force`` without an admin token.
    ``trusted_signature=true`` (``tunecache import``): a run whose signature does not check
    against the service's trusted keys (or a service without any) is refused with 409 before
    anything is stored; a run that checks is recorded as any other, its signature kept.
    """
    if force and not caller.scope.includes(Scope.ADMIN):
        raise HTTPException(403, detail="force=true (skipping the promotion policy) needs an admin token")
    if trusted_signature:  # an imported run: its signature is checked here, before anything is stored
        refused = publishing.untrusted_signature(body, state_of(request.app).trusted_keys)
        if refused is not None:
            raise HTTPException(409, detail=f"{refused}; nothing was recorded")
    try:  # ArtifactsMissing: 422 with "missing" (tunecache.service.errors)
        run = publishing.record_run(session, body, trusted=caller.scope.includes(Scope.TUNE), recorded_by=caller.name,
                                    trusted_keys=state_of(request.app).trusted_keys, force=force)
    except (publishing.IndeterminateEnvironment, publishing.NotAFlashInferFile) as exc:
        raise HTTPException(422, detail=str(exc)) from None
    request.state.audit_detail = (f"run {run.id} ({run.trigger}, {'verified' if run.verified else 'unverified'}"
                                  f"{', current' if run.is_current else ''}{', forced' if force else ''}) of "
                                  f"{run.key.model}" + (f"; held: {run.held}" if run.held else ""))
    return _json(run, 201)


@router.post("/{run_id}/promote", response_model=TuningRunRead,
             responses={404: {"model": ErrorBody, "description": "no such run"},
                        409: {"model": ErrorBody, "description": "the run cannot be current (failed, a pod's, "
                                                                 "or not signed by a key the service trusts)"}})
def promote_tuning(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, caller: AdminCaller,
                   request: Request, body: PromoteRequest | None = None) -> Response:
    """Make a run the current tuning of its key and environment (admin): roll back to an
    earlier run, or take one the promotion policy held back. The run must have succeeded and
    be verified (not a pod's), and, with ``TUNECACHE_TRUSTED_KEYS`` on the service, be signed
    by one of those keys: pods that trust them install it at their next lookup. With a body
    ``{"signature": ...}`` (the run's manifest signed anew) the run carries that signature
    from now on: pods that installed a newer run take it as the newer one. Audited."""
    # RunNotFound, PromotionRefused: 404, 409 (tunecache.service.errors), nothing written or audited
    run, previous = publishing.promote_run(session, run_id, state_of(request.app).trusted_keys,
                                           body.signature if body is not None else None)
    request.state.audit_detail = (f"promoted run {run.id} of {run.key.model} (current before: "
                                  f"{previous if previous is not None else 'none'})")
    return _json(run)


@router.put("/{run_id}/pin", response_model=TuningRunRead,
            responses={404: {"model": ErrorBody, "description": "no such run"}})
def pin_tuning(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, caller: AdminCaller,
               request: Request) -> Response:
    """Pin a run: the retention pass (``TUNECACHE_RUN_RETENTION``,
    :mod:`tunecache.service.retention`) never deletes it, however many runs of its key come
    after it (a known-good run to roll back to). Needs an ``admin`` token; idempotent; 404
    for an unknown run (or one retention already deleted). Audited."""
    return _pin(session, run_id, True, request)


@router.delete("/{run_id}/pin", response_model=TuningRunRead,
               responses={404: {"model": ErrorBody, "description": "no such run"}})
def unpin_tuning(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, caller: AdminCaller,
                 request: Request) -> Response:
    """Unpin a run: retention keeps or deletes it as any other run from its next pass. Needs
    an ``admin`` token; idempotent; 404 for an unknown run. Audited."""
    return _pin(session, run_id, False, request)


@router.post("/{run_id}/retire", response_model=RunRetired,
             responses={404: {"model": ErrorBody, "description": "no such run"}})
def retire_tuning(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, caller: AdminCaller,
                  request: Request) -> Response:
    """Retire a run (admin): it is never current again and never served, and stays in the
    history (``retired_at``). Where it was current, the newest usable run of its key and
    environment recorded before it takes its place (as a roll back), else none does
    (:mod:`tunecache.service.retiring`); ``current_run_id`` says which. Idempotent; 404 for
    an unknown run. Audited."""
    retired = retiring.retire_run(session, run_id, state_of(request.app).trusted_keys)
    current = retired.current_run_id
    request.state.audit_detail = (f"retired run {run_id} of {retired.run.key.model} (current now: "
                                  f"{f'run {current}' if current is not None else 'none'})")
    return Response(retired.model_dump_json(), media_type="application/json")  # serialized here, as _json


def _pin(session: Session, run_id: int, pinned: bool, request: Request) -> Response:
    try:
        run = repository.pin_run(session, run_id, pinned)
    except LookupError as exc:
        raise HTTPException(404, detail=str(exc)) from None
    request.state.audit_detail = f"{'pinned' if pinned else 'unpinned'} run {run.id} of {run.key.model}"
    return _json(run)


def _json(run: TuningRunRead, status: int = 200) -> Response:
    """A write's answer, serialized in the route's own thread: FastAPI would serialize a
    returned model of a sync route in another worker thread, for which the request would
    wait holding its transaction's row locks (the generation's, a new key's) while the
    threads it could run on wait for those locks (until the statement timeout)."""
    return Response(run.model_dump_json(), status_code=status, media_type="application/json")


@router.put("/{run_id}/verification", response_model=TuningRunRead,
            responses={404: {"model": ErrorBody, "description": "no such run"},
                       409: {"model": ErrorBody, "description": "the run did not succeed"}})
def record_verification(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], body: RunVerification, session: SessionDep,
                        caller: TuneCaller, request: Request) -> Response:
    """Store a run's verification boot (:class:`~tunecache.contract.RunVerification`): a
    tuning node's new vLLM process that installed the stored run as a pod does and counted
    what it still compiled. Needs a ``tune`` token (the nodes that record runs); a later
    verification of the same run replaces the earlier one. 404 for an unknown run, 409 for a
    run that did not succeed, 422 naming an invalid field. Audited."""
    try:
        run = publishing.record_verification(session, run_id, body)
    except LookupError as exc:
        raise HTTPException(404, detail=str(exc)) from None
    except ValueError as exc:
        raise HTTPException(409, detail=str(exc)) from None
    request.state.audit_detail = (f"verification of run {run.id}: " + (
        f"did not boot: {body.error}" if body.error else f"compiled {compiled_summary(body.compiled)}"))[:500]
    return _json(run)  # it moved the generation: answered without holding its row lock (see _json)


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
    rejects a file on any mismatch. With ``variant`` (the pod's engine variant), the current
    run of that variant where it has one, else the key's current run (its ``variant`` names
    the variant it is for: the pod installs all but its compile cache). With ``dependencies``
    (the pod's torch, Triton and TVM-FFI versions: its image), a run made on another image never
    takes the place of the pod's own: the variant's run of another image is passed over, and
    where the key's current run is of another image, the current run of the pod's image is the
    answer when it has one (:mod:`tunecache.service.images`); without ``dependencies``, as before. 404 body: ``{"detail": "...", "closest": [{"run_id",
    "key", "environment_hash", "differences": [{"field", "stored", "yours"}]}]}``.

    The hot path of a boot: answered from the process's
    :class:`~tunecache.service.lookup_cache.LookupCache` while the tuning generation (read by
    a query that began after this request did, shared with the requests beside it) has
    not moved; otherwise computed in a transaction of its own, once for all the requests
    that miss on the same key and environment at the same time. A database that does not
    answer within ``TUNECACHE_DB_STATEMENT_TIMEOUT`` + ``TUNECACHE_DB_POOL_TIMEOUT`` seconds
    (frozen, partitioned) gives 503 with ``Retry-After``.

    When the generation cannot be read within ``TUNECACHE_LOOKUP_STALE_AFTER`` seconds (or
    its read fails), an answer held in memory at the last generation read, at most
    ``TUNECACHE_LOOKUP_STALE_SECONDS`` ago, is served with ``Tunecache-Stale: <seconds
    since that read began>``: a pod boots with what was current then.
    """
    state = state_of(request.app)
    settings = state.settings
    reader = state.generation_reader
    try:
        with anyio.fail_after(settings.db_statement_timeout + settings.db_pool_timeout):
            try:
                with anyio.fail_after(settings.lookup_stale_after):
                    generation = await reader.current()
            except Exception as exc:  # noqa: BLE001 - too slow or failed: an answer held in memory, or wait on
                stale = _stale_answer(state, body)
                if stale is not None:
                    return stale
                if not isinstance(exc, TimeoutError):
                    raise
                generation = await reader.current()
            image = _image(body)
            answer = cached = state.lookup_cache.get(generation, body.key, body.environment, body.variant, image)
            if cached is None:
                answer = await state.lookup_cache.answer(
                    generation, body.key, body.environment,
                    lambda: anyio.to_thread.run_sync(_lookup_answer, state.sessions, body, settings.reads_show_identities,
                                                     abandon_on_cancel=True),
                    body.variant, image)
    except TimeoutError:  # a frozen database: the pod comes back later, the service stays up
        metrics.count_lookup_error()
        return JSONResponse(status_code=503, content={"detail": "database did not answer in time, try again"},
                            headers={"Retry-After": str(settings.retry_after_seconds)})
    except Exception:  # the database failed (503 by the error handlers), or anything else (500)
        metrics.count_lookup_error()
        raise
    metrics.count_lookup(answer[0], from_cache=cached is not None)
    return Response(content=answer[1], status_code=answer[0], media_type="application/json")


def _stale_answer(state: ServiceState, body: LookupRequest) -> Response | None:
    """The answer held in memory at the last generation read, when that read began at most
    ``TUNECACHE_LOOKUP_STALE_SECONDS`` ago, marked ``Tunecache-Stale``; else ``None``."""
    generation = state.generation_reader.last_read(state.settings.lookup_stale_seconds)
    answer = None if generation is None else state.lookup_cache.get(generation, body.key, body.environment, body.variant,
                                                                    _image(body))
    if answer is None:
        return None
    metrics.count_lookup(answer[0], from_cache=True)
    return Response(content=answer[1], status_code=answer[0], media_type="application/json",
                    headers={STALE_HEADER: f"{state.generation_reader.age():.1f}"})


#: Header of a lookup answered from memory while the generation could not be read: the
#: seconds since the read of the generation it was answered at began.
STALE_HEADER = "Tunecache-Stale"


def _image(body: LookupRequest) -> str | None:
    """The image of the pod's ``dependencies`` (:func:`tunecache.formats.dependencies.image_of`;
    ``None``: it sent none, and is answered as before images)."""
    return image_of(body.dependencies) if body.dependencies else None


def _lookup_answer(sessions: sessionmaker[Session], body: LookupRequest, identities: bool) -> tuple[int, bytes]:
    """``(status, JSON body)`` of a lookup, computed in one transaction. The same bytes answer
    every caller of the key, environment, variant and image (a pod's answer): a run as
    :func:`~tunecache.service.redaction.run_for_readers` shows it, with identities only where
    ``TUNECACHE_READS_SHOW_IDENTITIES`` shows them to all."""
    with sessions.begin() as session:
        result = repository.lookup(session, body.key, body.environment, body.variant, _image(body))
    if isinstance(result, LookupMiss):
        return 404, result.model_dump_json().encode()
    return 200, redaction.run_for_readers(result, identities).model_dump_json().encode()


#: Runs read per transaction of a CSV export.
CSV_CHUNK = 500


@router.get("", response_model=TuningRunPage,
            responses={200: {"description": "A page of the history (JSON), or with format=csv / Accept: text/csv every "
                                            "matching run as CSV, a header row first",
                             "content": {"text/csv": {"schema": {"type": "string"}}}}})
def list_tunings(filters: Annotated[TuningRunQuery, Query()], request: Request, caller: ReadCaller) -> Response:
    """Tuning history, newest first (``created_at``, then ``id``), filtered by any key or
    environment field, ``status``, ``trigger``, ``since``/``until`` and ``current_only``
    (:class:`~tunecache.contract.TuningRunQuery`).

    JSON (default): a :class:`~tunecache.contract.TuningRunPage` of ``limit`` runs from
    ``cursor`` (the ``next_cursor`` of the page before) or ``offset``; ``total`` counts
    every match. CSV (``format=csv``, or ``Accept: text/csv`` without ``format``): every
    matching run from ``cursor`` on, streamed: a header row of
    :data:`~tunecache.contract.RUN_CSV_COLUMNS`, then one row per run, read
    :data:`CSV_CHUNK` runs per short transaction (no connection is held while rows are
    sent); a database failure after the header ends the body early (the client sees it cut
    short). 422 names an unknown or invalid parameter (``cursor`` not one this service gave
    out, ``until`` not after ``since``, ``offset`` with ``cursor``).

    Runs as :func:`~tunecache.service.redaction.run_for_readers` shows them: token and host
    names (``recorded_by``, ``node``) only to an admin token (or everyone with
    ``TUNECACHE_READS_SHOW_IDENTITIES``), ``(hidden)`` for others.
    """
    state = state_of(request.app)
    sessions: sessionmaker[Session] = state.sessions
    identities = redaction.shows_identities(caller, state.settings)
    if _wants_csv(filters, request.headers.get("accept", "")):
        return StreamingResponse(_csv_rows(sessions, filters, identities), media_type="text/csv; charset=utf-8",
                                 headers={"Content-Disposition": 'attachment; filename="tunecache-history.csv"'})
    with sessions.begin() as session:
        page = repository.list_runs(session, filters)
    return Response(redaction.runs_page_for_readers(page, identities).model_dump_json(), media_type="application/json")


def _wants_csv(filters: TuningRunQuery, accept: str) -> bool:
    """``format`` decides when given; else ``Accept`` when it names ``text/csv`` before any JSON type."""
    if "format" in filters.model_fields_set:
        return filters.format == "csv"
    for part in accept.split(","):
        media_type = part.split(";")[0].strip().lower()
        if media_type == "text/csv":
            return True
        if media_type in ("application/json", "application/*", "*/*"):
            return False
    return False


def _csv_rows(sessions: sessionmaker[Session], filters: TuningRunQuery, identities: bool) -> Iterator[str]:
    """The CSV export: header, then every run matching ``filters`` from its cursor on,
    :data:`CSV_CHUNK` per transaction (each chunk read in a thread by Starlette), each as
    :func:`~tunecache.service.redaction.run_for_readers` shows it."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(RUN_CSV_COLUMNS)
    position = filters.position()
    while True:
        with sessions.begin() as session:
            runs, position = repository.runs_page(session, filters, position, CSV_CHUNK)
        writer.writerows(run_csv_row(redaction.run_for_readers(run, identities)) for run in runs)
        yield out.getvalue()
        out.seek(0)
        out.truncate()
        if position is None:
            return


@router.get("/{run_id:int}", response_model=TuningRunRead, responses={404: {"model": ErrorBody, "description": "no such run"}})
def get_tuning(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, caller: ReadCaller,
               settings: SettingsDep) -> TuningRunRead:
    """One run by id, as :func:`~tunecache.service.redaction.run_for_readers` shows it (token
    and host names to an admin token only, unless ``TUNECACHE_READS_SHOW_IDENTITIES``). 404
    if there is none."""
    run = repository.get_run(session, run_id)
    if run is None:
        raise HTTPException(404, detail=f"no tuning run {run_id}")
    return redaction.run_for_readers(run, redaction.shows_identities(caller, settings))


RunId = Annotated[int, Path(ge=1, le=MAX_ID)]


@router.get(
    "/{run_a:int}/diff/{run_b:int}",
    response_model=TuningRunDiff,
    responses={
        404: {"model": ErrorBody, "description": "no such run: the detail names each missing one"},
        422: {"model": ErrorBody, "description": "a run has no FlashInfer autotune file, or one that cannot be read "
                                                 "or is over the size a diff reads; the detail names the run"},
        503: {"model": ErrorBody, "description": "this server process is computing another diff: retry after Retry-After"},
    },
)
def diff_tunings(run_a: RunId, run_b: RunId, request: Request, _caller: ReadCaller) -> TuningRunDiff:
    """Which entries of FlashInfer's autotune file changed between run ``run_a`` and run
    ``run_b`` (:class:`~tunecache.contract.TuningRunDiff`).

    Reads each run's ``flashinfer_autotune_v1`` artifact (FlashInfer's v1 file,
    ``flashinfer/autotuner/autotuner.py`` ``AutoTuner.save_configs``) from the blob store,
    matches entries by their exact key, and lists every entry added, removed, or with
    another tactic: op, runner, bucketed shapes, tactic in each run, FlashInfer's recorded
    ``time_ms`` (milliseconds) and ``margin`` (relative) in each where the file has them,
    and ``regression`` when a changed entry is slower beyond its recorded margin (the rule:
    :class:`~tunecache.contract.TacticChange`); plus the key and environment fields in
    which the runs differ and the counts. Files without FlashInfer's selection records
    (before 0.7.4) give no times and no regressions.

    Bounded (:func:`tunecache.service.run_diff.diff_stored_runs`): each file is read only up
    to :data:`~tunecache.service.run_diff.MAX_DIFF_FILE_BYTES`, in one short transaction; the
    comparison runs after it, holding no database connection; a server process computes
    :data:`~tunecache.service.run_diff.DIFFS_AT_ONCE` diff at a time (503 with
    ``Retry-After`` for another meanwhile).

    Errors: 404 ``{"detail": "no tuning run 7"}`` (every missing id named); 422 when a run
    has no FlashInfer autotune artifact (e.g. a failed run), one over the size limit, or
    one that is not a FlashInfer autotune file; 503 with ``Retry-After`` while this server
    process computes another diff.
    """
    return run_diff.diff_stored_runs(state_of(request.app).sessions, state_of(request.app).diff_slots, run_a, run_b)
