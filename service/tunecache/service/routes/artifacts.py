"""``/v1/artifacts/{sha256}``: content-addressed bytes (FlashInfer cache files, JIT modules)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response

from tunecache.service import repository
from tunecache.service.deps import SessionDep
from tunecache.service.schemas import SHA256_PATTERN, ArtifactStored

router = APIRouter(prefix="/artifacts", tags=["artifacts"])

Sha256 = Annotated[str, Path(pattern=SHA256_PATTERN, description="lowercase hex sha256 of the bytes")]


@router.put("/{sha256}", response_model=ArtifactStored, status_code=201)
async def upload_artifact(sha256: Sha256, request: Request, session: SessionDep, response: Response) -> ArtifactStored:
    """Store the raw request body under its sha256.

    Idempotent: 201 when stored now, 200 when the same bytes were already there.
    Errors: 422 when the body does not hash to ``sha256`` (nothing is stored); 413 when
    it exceeds ``TUNECACHE_MAX_UPLOAD_BYTES``.
    """
    data = await request.body()
    try:
        stored = repository.store_blob(session, data, sha256)
    except repository.DigestMismatch as exc:
        raise HTTPException(422, detail=str(exc)) from None
    session.commit()
    if not stored.created:
        response.status_code = 200
    return stored


@router.get("/{sha256}", response_class=Response, responses={200: {"content": {"application/octet-stream": {}}}})
def download_artifact(sha256: Sha256, session: SessionDep) -> Response:
    """The bytes stored under ``sha256`` (``ETag`` is the sha256). 404 if none are stored."""
    data = repository.read_blob(session, sha256)
    if data is None:
        raise HTTPException(404, detail=f"no artifact with sha256 {sha256}")
    return Response(content=data, media_type="application/octet-stream", headers={"ETag": f'"{sha256}"'})
