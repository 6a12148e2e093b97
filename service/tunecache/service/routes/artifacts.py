"""``/v1/artifacts/{sha256}``: content-addressed bytes (FlashInfer cache files, JIT modules)."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import APIRouter, HTTPException, Path, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from tunecache.contract import SHA256_PATTERN, ArtifactStored, ErrorBody
from tunecache.service import artifact_store, blobs
from tunecache.service.deps import SessionDep
from tunecache.service.artifact_files import ArtifactFiles
from tunecache.service.metrics import ArtifactFileResponse, ArtifactResponse, ArtifactStreamingResponse
from tunecache.service.policy import PushCaller, ReadCaller
from tunecache.service.state import state_of

log = logging.getLogger("tunecache")

router = APIRouter(prefix="/artifacts", tags=["artifacts"])

Sha256 = Annotated[str, Path(pattern=SHA256_PATTERN, description="lowercase hex sha256 of the bytes")]

#: Upload bodies up to this size are spooled in memory, larger ones on disk.
_SPOOL_MEMORY_BYTES = 8 * 1024 * 1024
#: Retry-After of a 503 for an upload whose spool's disk is full.
_FULL_SPOOL_RETRY_S = 30
#: Artifacts never change under their sha256: any HTTP cache may keep them for a year.
IMMUTABLE = "public, max-age=31536000, immutable"


def _etag(sha256: str) -> str:
    return f'"{sha256}"'


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _usable_ranges(header: str | None, size: int) -> tuple[bool, bool]:
    """``(use_it, satisfiable)`` for a ``Range`` header: a header that is not a list of
    well-formed byte ranges is ignored (RFC 9110 14.2: the whole content is sent);
    a well-formed one none of whose ranges starts inside the content is unsatisfiable."""
    if not header:
        return False, True
    unit, _, specs = header.partition("=")
    satisfiable = False
    for spec in specs.split(","):
        match = _RANGE.match(f"{unit.strip()}={spec.strip()}")
        if match is None or match[1] == match[2] == "":
            return False, True
        start, end = match[1], match[2]
        if start and end and int(start) > int(end):
            return False, True
        if (start and int(start) < size) or (not start and int(end) > 0):
            satisfiable = True
    return True, satisfiable


def _not_modified(if_none_match: str | None, sha256: str) -> bool:
    """Whether an ``If-None-Match`` header names this artifact's ETag (or ``*``)."""
    if not if_none_match:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or _etag(sha256) in tags


@router.put(
    "/{sha256}",
    response_model=ArtifactStored,
    status_code=201,
    responses={200: {"model": ArtifactStored, "description": "the same bytes were stored already"}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary"}}}}},
)
async def upload_artifact(sha256: Sha256, request: Request, session: SessionDep, response: Response,
                          _caller: PushCaller) -> ArtifactStored:
    """Store the raw request body under its sha256, streamed (never whole in memory).
    Needs a ``push`` token (bytes alone change nothing a pod installs: a run names them).

    Idempotent: 201 when stored now, 200 when the same bytes were already there.
    The bytes go to the configured artifact store (``TUNECACHE_ARTIFACT_STORE``: the
    database, or an object store, where they are hashed before anything is written).

    Errors: 422 when the body does not hash to ``sha256`` (the request's transaction is
    rolled back: nothing is stored); 413 when it exceeds ``TUNECACHE_MAX_UPLOAD_BYTES``;
    503 with ``Retry-After`` when the object store is unavailable or the upload spool's disk
    (``TMPDIR``) is full.
    """
    try:
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY_BYTES) as spool:
            async for part in request.stream():
                spool.write(part)
            spool.seek(0)
            try:
                stored = await run_in_threadpool(artifact_store.store_blob, session, spool, sha256)
            except blobs.DigestMismatch as exc:
                raise HTTPException(422, detail=str(exc)) from None
    except OSError as exc:  # the spool's disk full: the client retries (it answered 500 before)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise HTTPException(503, detail=f"no room to receive the upload: {os.strerror(exc.errno)} in the upload "
                                        f"spool ({tempfile.gettempdir()}); retry later",
                            headers={"Retry-After": str(_FULL_SPOOL_RETRY_S)}) from None
    if not stored.created:
        response.status_code = 200
    request.state.audit_detail = f"{stored.size_bytes} bytes ({'stored' if stored.created else 'already stored'})"
    return stored


@router.get(
    "/{sha256}",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "the bytes"},
        206: {"content": {"application/octet-stream": {}}, "description": "the requested byte range"},
        307: {"description": "download it from the object store: Location is a presigned URL "
                             "(TUNECACHE_ARTIFACT_REDIRECT=on; never for a Range request)"},
        304: {"description": "the client's copy (If-None-Match) is this artifact"},
        404: {"model": ErrorBody, "description": "no artifact is stored under this sha256"},
        416: {"description": "the requested range is outside the artifact"},
    },
)
async def download_artifact(sha256: Sha256, request: Request, _caller: ReadCaller) -> Response:
    """The bytes stored under ``sha256``.

    Served from the node's mirror (:class:`~tunecache.service.artifact_files.ArtifactFiles`:
    small artifacts from memory, others from their file), filled from the database on
    first use (once for all the requests that ask for it meanwhile), so no database
    connection is held while a pod reads. ``ETag`` is the
    sha256 and ``Cache-Control`` marks the bytes immutable; ``If-None-Match`` gives 304,
    ``Range`` 206 (Starlette's ``FileResponse``; a malformed ``Range`` is ignored, one
    outside the artifact is 416). 404 if none are stored.

    With ``TUNECACHE_ARTIFACT_REDIRECT=on``, an artifact in the object store is answered
    307 to a presigned URL valid ``TUNECACHE_PRESIGN_SECONDS``: the pod downloads it from
    the store (a request with ``Range`` is still served here, from the mirror).
    """
    files = state_of(request.app).artifact_files
    sessions = state_of(request.app).sessions
    settings = state_of(request.app).settings
    if (settings.artifact_redirect and state_of(request.app).artifact_stores.object_store is not None
            and "range" not in request.headers):
        signed = await run_in_threadpool(_presigned, sessions, sha256, settings.presign_seconds)
        if signed is None:
            raise HTTPException(404, detail=f"no artifact with sha256 {sha256}")
        if signed[1] is not None:
            if _not_modified(request.headers.get("if-none-match"), sha256):
                return Response(status_code=304, headers={"ETag": _etag(sha256), "Cache-Control": IMMUTABLE})
            # the URL expires: no cache keeps the redirect
            return Response(status_code=307, headers={"Location": signed[1], "Cache-Control": "no-store",
                                                      "ETag": _etag(sha256)})
    data = files.in_memory(sha256)
    wants_range = "range" in request.headers
    path = None
    file_threads = state_of(request.app).file_threads
    if data is None or wants_range:  # ranges come from the file (mirrored again if it was removed)
        # a mirrored file is found in a file thread: never behind routes waiting for the database
        found = await anyio.to_thread.run_sync(_mirrored_file, files, sha256, limiter=file_threads)
        if found is None:
            found = await state_of(request.app).artifact_mirrors.run(
                sha256, lambda: run_in_threadpool(_mirrored, sessions, files, sha256))
        if found is None:
            raise HTTPException(404, detail=f"no artifact with sha256 {sha256}")
        if isinstance(found, FilePath):
            path = found
        else:  # the mirror cannot be written: the bytes come from their store, whole (a Range is ignored)
            data, wants_range = (found, False) if isinstance(found, bytes) else (None, False)
    headers = {"ETag": _etag(sha256), "Cache-Control": IMMUTABLE, "Accept-Ranges": "bytes"}
    if _not_modified(request.headers.get("if-none-match"), sha256):
        return Response(status_code=304, headers=headers)
    if path is None and data is None:  # too large to hold in memory: streamed from its store
        headers = {"ETag": _etag(sha256), "Cache-Control": IMMUTABLE, "Content-Length": str(found.size)}
        if found.location == blobs.LOCATION:  # one chunk per transaction
            parts = _chunks_from_database(sessions, sha256)
        else:  # no database connection held
            parts = state_of(request.app).artifact_stores.at(found.location).iter_bytes(None, sha256)
        return ArtifactStreamingResponse(parts, media_type="application/octet-stream", headers=headers)
    if path is not None:
        stat_result = await anyio.to_thread.run_sync(os.stat, path, limiter=file_threads)
    if wants_range:
        size = stat_result.st_size
        use_range, satisfiable = _usable_ranges(request.headers.get("range"), size)
        if use_range and not satisfiable:
            return JSONResponse(status_code=416, content={"detail": f"no requested range starts within the {size} bytes"},
                                headers={**headers, "Content-Range": f"bytes */{size}"})
        if use_range:
            return ArtifactFileResponse(path, media_type="application/octet-stream", headers=headers,
                                        stat_result=stat_result, limiter=file_threads)
        # ignored: FileResponse must not see it either
        request.scope["headers"] = [(k, v) for k, v in request.scope["headers"] if k != b"range"]
    # the bytes sent are counted (tunecache_artifact_bytes_served_total)
    if data is not None:
        return ArtifactResponse(content=data, media_type="application/octet-stream", headers=headers)
    return ArtifactFileResponse(path, media_type="application/octet-stream", headers=headers, stat_result=stat_result,
                                limiter=file_threads)


def _mirrored_file(files: ArtifactFiles, sha256: str) -> FilePath | None:
    """The artifact's mirrored file (its bytes then held in memory when small), or ``None``."""
    path = files.get(sha256)
    if path is not None:
        files.remember(sha256, path)
    return path


def _presigned(sessions: sessionmaker[Session], sha256: str, expires_s: int) -> tuple[int, str | None] | None:
    with sessions.begin() as session:
        return artifact_store.presigned_url(session, sha256, expires_s)


@dataclass(frozen=True)
class _Unmirrored:
    """An artifact that could not be mirrored and is too large to hold in memory: sent
    from its store (``location``) part by part."""

    size: int
    location: str


def _mirrored(sessions: sessionmaker[Session], files: ArtifactFiles, sha256: str) -> FilePath | bytes | _Unmirrored | None:
    """The artifact's file, mirrored from its store when it is not yet; ``None`` when
    nothing is stored under ``sha256``. A blob in the database is copied in one unit of
    work; one in the object store is read with no database connection held.

    When the mirror cannot be written (a full disk, an I/O error: ``OSError``) the node
    keeps serving from the store, and ``/v1/health`` says ``degraded`` until a mirror
    write succeeds again: a small artifact's bytes (verified, then held in memory), or
    :class:`_Unmirrored` for a large one."""
    path = files.get(sha256)
    if path is None:
        with sessions.begin() as session:
            found = artifact_store.locate(session, sha256, hold=True)  # a move waits for this read
            if found is None:
                return None
            size, location = found
            store = artifact_store.stores_of(session).at(location)
            if location == blobs.LOCATION:
                try:
                    path = files.write(sha256, store.iter_bytes(session, sha256))
                except OSError as exc:
                    return _unwritable(files, sha256, exc, store, session, size)
        if path is None:
            try:
                path = files.write(sha256, store.iter_bytes(None, sha256))
            except OSError as exc:
                return _unwritable(files, sha256, exc, store, None, size)
        files.note_written()
    files.remember(sha256, path)
    return path


def _unwritable(files: ArtifactFiles, sha256: str, exc: OSError, store: artifact_store.ArtifactStore,
                session: Session | None, size: int) -> bytes | _Unmirrored:
    """A small artifact's bytes read from its store and verified (and held in memory), or
    :class:`_Unmirrored` for a large one: the mirror could not be written."""
    log.warning("artifact %s not mirrored, served from the %s store: %s", sha256, store.location, exc)
    files.note_write_failure(exc)
    if size > files.memory_max_item:
        return _Unmirrored(size, store.location)
    data = b"".join(store.iter_bytes(session, sha256))
    if hashlib.sha256(data).hexdigest() != sha256:
        raise blobs.DigestMismatch(f"stored blob {sha256} hashes to {hashlib.sha256(data).hexdigest()}")
    files.hold(sha256, data)
    return data


def _chunks_from_database(sessions: sessionmaker[Session], sha256: str) -> Iterator[bytes]:
    """A stored blob's chunks, each read in a short transaction of its own (no connection
    is held while the pod reads)."""
    seq = 0
    while True:
        with sessions.begin() as session:
            chunk = blobs.read_chunk(session, sha256, seq)
        if chunk is None:
            return
        yield chunk
        seq += 1


@router.head("/{sha256}", responses={200: {"description": "stored: Content-Length and ETag"},
                                     404: {"description": "nothing is stored under this sha256"}})
async def artifact_exists(sha256: Sha256, request: Request, _caller: ReadCaller) -> Response:
    """200 with ``Content-Length`` when the bytes are stored (uploaders skip them), else 404.
    A mirrored artifact is answered from its file (in a file thread, without the database)."""
    state = state_of(request.app)
    path = await anyio.to_thread.run_sync(state.artifact_files.get, sha256, limiter=state.file_threads)
    if path is not None:
        size = (await anyio.to_thread.run_sync(os.stat, path, limiter=state.file_threads)).st_size
    else:
        size = await run_in_threadpool(_stored_size, state.sessions, sha256)
    if size is None:
        return Response(status_code=404, media_type="application/json")
    return Response(status_code=200, media_type="application/octet-stream",
                    headers={"ETag": _etag(sha256), "Content-Length": str(size), "Cache-Control": IMMUTABLE,
                             "Accept-Ranges": "bytes"})


def _stored_size(sessions: sessionmaker[Session], sha256: str) -> int | None:
    with sessions.begin() as session:
        return artifact_store.blob_size(session, sha256)
