"""``/v1/artifacts/{sha256}``: content-addressed bytes (FlashInfer cache files, JIT modules)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from tunecache.contract import SHA256_PATTERN, ArtifactStored
from tunecache.service import blobs
from tunecache.service.deps import SessionDep

router = APIRouter(prefix="/artifacts", tags=["artifacts"])

Sha256 = Annotated[str, Path(pattern=SHA256_PATTERN, description="lowercase hex sha256 of the bytes")]

#: Upload bodies up to this size are spooled in memory, larger ones on disk.
_SPOOL_MEMORY_BYTES = 8 * 1024 * 1024


@router.put("/{sha256}", response_model=ArtifactStored, status_code=201)
async def upload_artifact(sha256: Sha256, request: Request, session: SessionDep, response: Response) -> ArtifactStored:
    """Store the raw request body under its sha256, streamed (never whole in memory).

    Idempotent: 201 when stored now, 200 when the same bytes were already there.
    Errors: 422 when the body does not hash to ``sha256`` (the request's transaction is
    rolled back: nothing is stored); 413 when it exceeds ``TUNECACHE_MAX_UPLOAD_BYTES``.
    """
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY_BYTES) as spool:
        async for part in request.stream():
            spool.write(part)
        spool.seek(0)
        try:
            stored = await run_in_threadpool(blobs.store_blob, session, spool, sha256)
        except blobs.DigestMismatch as exc:
            raise HTTPException(422, detail=str(exc)) from None
    if not stored.created:
        response.status_code = 200
    return stored


@router.get("/{sha256}", response_class=StreamingResponse, responses={200: {"content": {"application/octet-stream": {}}}})
def download_artifact(sha256: Sha256, session: SessionDep, request: Request) -> StreamingResponse:
    """The bytes stored under ``sha256``, streamed chunk by chunk (``ETag`` is the sha256,
    ``Content-Length`` the size). 404 if none are stored."""
    size = blobs.blob_size(session, sha256)
    if size is None:
        raise HTTPException(404, detail=f"no artifact with sha256 {sha256}")
    sessions = request.app.state.sessions

    def chunks() -> Iterator[bytes]:
        with sessions() as stream_session:  # the request's session may be closed while streaming
            yield from blobs.iter_blob(stream_session, sha256)

    return StreamingResponse(
        chunks(),
        media_type="application/octet-stream",
        headers={"ETag": f'"{sha256}"', "Content-Length": str(size)},
    )


@router.head("/{sha256}")
def artifact_exists(sha256: Sha256, session: SessionDep) -> Response:
    """200 with ``Content-Length`` when the bytes are stored (uploaders skip them), else 404."""
    size = blobs.blob_size(session, sha256)
    if size is None:
        return Response(status_code=404)
    return Response(status_code=200, headers={"ETag": f'"{sha256}"', "Content-Length": str(size)})
