"""Content-addressed artifact bytes, stored in chunks of :data:`CHUNK_BYTES`.

Bytes go in from a stream and come out as an iterator, one chunk in memory at a time, so
a JIT module of hundreds of MB neither sits whole in the service's memory nor in one
database value. This is the database's artifact store; an object store may hold the bytes
instead (:mod:`tunecache.service.artifact_store`, which callers go through). Like the repository, functions take the caller's session and never commit.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator
from typing import BinaryIO

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from tunecache.service import dialect
from tunecache.service.models import ArtifactBlob, ArtifactChunk, utcnow
from tunecache.contract import ArtifactStored

#: Bytes per stored chunk (4 MiB).
CHUNK_BYTES = 4 * 1024 * 1024
#: A blob uploaded again more than this long after its ``created_at`` gets a new one (a
#: write only then: identical uploads at once do not all write the row).
RENEW_AFTER = dt.timedelta(minutes=10)
#: ``artifact_blobs.location`` of a blob whose bytes are these chunks.
LOCATION = "database"


class DigestMismatch(ValueError):
    """Uploaded bytes do not hash to the sha256 they were uploaded under."""


def store_blob(session: Session, stream: BinaryIO, expected_sha256: str) -> ArtifactStored:
    """Store the bytes read from ``stream`` under ``expected_sha256``.

    Idempotent: when the blob is already stored, the bytes are only hashed (``created=False``)
    and, when it was uploaded more than :data:`RENEW_AFTER` ago, its ``created_at`` is
    renewed: the collector (:func:`tunecache.service.retention.collect_blobs`) leaves bytes
    uploaded within its grace alone, so an upload for a run about to be recorded counts as a
    new one. Concurrent uploads of the same bytes are safe.

    Raises:
        DigestMismatch: the bytes hash to something else (also when the blob is stored
            already). Chunks written so far are in the caller's transaction, which must be
            rolled back (nothing is then stored).
    """
    if session.get(ArtifactBlob, expected_sha256) is not None:
        digest = hashlib.sha256()
        while chunk := stream.read(CHUNK_BYTES):
            digest.update(chunk)
        if digest.hexdigest() != expected_sha256:
            raise DigestMismatch(f"body hashes to sha256 {digest.hexdigest()}, not {expected_sha256}")
        now = utcnow()
        session.execute(update(ArtifactBlob).where(ArtifactBlob.sha256 == expected_sha256,
                                                   ArtifactBlob.created_at < now - RENEW_AFTER).values(created_at=now))
        return ArtifactStored(sha256=expected_sha256, size_bytes=blob_size(session, expected_sha256) or 0, created=False)
    dialect.insert_or_ignore(
        session, ArtifactBlob.__table__,
        {"sha256": expected_sha256, "size_bytes": 0, "created_at": utcnow()}, ["sha256"]  # location: its default
    )
    size = write_chunks(session, stream, expected_sha256)
    blob = session.get(ArtifactBlob, expected_sha256, populate_existing=True)
    blob.size_bytes = size
    session.flush()
    return ArtifactStored(sha256=expected_sha256, size_bytes=size, created=True)


def write_chunks(session: Session, stream: BinaryIO, expected_sha256: str) -> int:
    """Write the bytes read from ``stream`` as the chunks of the blob ``expected_sha256``
    (whose ``artifact_blobs`` row exists) and return their size; chunks already there are
    left as they are.

    Raises:
        DigestMismatch: the bytes hash to something else (the caller rolls back).
    """
    digest = hashlib.sha256()
    size = seq = 0
    while chunk := stream.read(CHUNK_BYTES):
        digest.update(chunk)
        size += len(chunk)
        dialect.insert_or_ignore(
            session, ArtifactChunk.__table__, {"sha256": expected_sha256, "seq": seq, "data": chunk}, ["sha256", "seq"]
        )
        seq += 1
    if digest.hexdigest() != expected_sha256:
        raise DigestMismatch(f"body hashes to sha256 {digest.hexdigest()}, not {expected_sha256}")
    return size


def delete_chunks(session: Session, sha256: str) -> None:
    """Delete a blob's chunks (its row stays: its bytes moved to another store)."""
    session.execute(delete(ArtifactChunk).where(ArtifactChunk.sha256 == sha256))


def blob_size(session: Session, sha256: str) -> int | None:
    """Size in bytes of a stored blob, or ``None`` if it is not stored."""
    return session.scalar(select(ArtifactBlob.size_bytes).where(ArtifactBlob.sha256 == sha256))


def iter_blob(session: Session, sha256: str) -> Iterator[bytes]:
    """The blob's bytes, one chunk at a time, in order."""
    seq = 0
    while (data := session.scalar(select(ArtifactChunk.data).where(ArtifactChunk.sha256 == sha256, ArtifactChunk.seq == seq))) is not None:
        yield data
        seq += 1


def read_chunk(session: Session, sha256: str, seq: int) -> bytes | None:
    """Chunk ``seq`` of a blob, or ``None`` past its last chunk (or when it is not stored)."""
    return session.scalar(select(ArtifactChunk.data).where(ArtifactChunk.sha256 == sha256, ArtifactChunk.seq == seq))


def read_blob(session: Session, sha256: str) -> bytes | None:
    """The whole blob, or ``None`` if it is not stored (for small blobs)."""
    if blob_size(session, sha256) is None:
        return None
    return b"".join(iter_blob(session, sha256))
